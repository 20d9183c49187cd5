"""A fingerprint keeps what identifies a deployment, and a change is told from noise (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kvwatch.canary.model import ProbeKind
from kvwatch.engines.base import Discovery, identity_of
from kvwatch.fingerprint import (
    MISSES_TO_DOWN,
    Reason,
    Seen,
    change_kinds,
    digest,
    fingerprint_of,
    observe,
    run_after,
)

V1 = {"model": "glm", "context_window": "131072", "version": "0.11.0", "process_start": "100"}


def test_a_fingerprint_holds_the_reported_identity_window_pool_and_model() -> None:
    """Only reported facts are kept, as text; an unreported field is left out."""
    found = Discovery(
        context_window=131072,
        kv_pool_tokens=None,
        model="glm",
        detail="busy: 12 requests running",
        identity=identity_of(version="0.11.0", process_start=1733380800.0, build=None),
    )
    assert fingerprint_of(found) == {
        "context_window": "131072",
        "model": "glm",
        "process_start": "1733380800",
        "version": "0.11.0",
    }


def test_the_digest_ignores_field_order() -> None:
    """Two equal fingerprints hash alike whatever order their fields came in."""
    assert digest(dict(reversed(list(V1.items())))) == digest(V1)


def test_the_first_fingerprint_is_no_change() -> None:
    """With nothing to compare, the first self-report is only remembered."""
    seen, change = observe(None, V1)
    assert seen == Seen(V1) and change is None


def test_a_new_version_is_a_fingerprint_change_with_its_fields() -> None:
    """A redeploy that changes the release and the start names both fields."""
    after = {**V1, "version": "0.12.0", "process_start": "200"}
    _, change = observe(Seen(V1), after)
    assert change is not None
    assert change.reason is Reason.FINGERPRINT
    assert change.fields == ["process_start", "version"]
    assert (change.before, change.after) == (V1, after)


def test_a_new_process_with_the_same_facts_is_a_restart() -> None:
    """Only the process start moved: a restart."""
    _, change = observe(Seen(V1), {**V1, "process_start": "300"})
    assert change is not None and change.reason is Reason.RESTART


def test_an_unchanged_report_is_no_change() -> None:
    """The same facts again change nothing and clear the misses."""
    seen, change = observe(Seen(V1, misses=1), dict(V1))
    assert change is None and seen.misses == 0


def test_an_engine_that_stops_answering_and_comes_back_was_restarted() -> None:
    """After MISSES_TO_DOWN missed self-reports, its return is a restart even with the
    same facts; a single miss is not."""
    seen = Seen(V1)
    for _ in range(MISSES_TO_DOWN):
        seen, change = observe(seen, None)
        assert change is None
    assert seen.fields == V1 and seen.misses == MISSES_TO_DOWN
    _, change = observe(seen, dict(V1))
    assert change is not None and change.reason is Reason.RESTART and change.fields == []
    _, change = observe(Seen(V1, misses=1), dict(V1))
    assert change is None


def test_a_change_inside_the_gap_waits_for_the_gap_to_end() -> None:
    """At once without a previous run or after the gap; else when the gap ends."""
    t = datetime(2026, 12, 5, 7, 0, tzinfo=UTC)
    assert run_after(t, None, 600) == t
    assert run_after(t, t - timedelta(minutes=11), 600) == t
    assert run_after(t, t - timedelta(minutes=4), 600) == t + timedelta(minutes=6)


def test_a_change_runs_every_prompted_kind_but_not_the_capacity_check() -> None:
    """The capacity check saw the change; everything that sends a prompt runs."""
    kinds = (ProbeKind.UNDER, ProbeKind.CAPACITY, ProbeKind.OVER, ProbeKind.BURST)
    assert change_kinds(kinds) == (ProbeKind.UNDER, ProbeKind.OVER, ProbeKind.BURST)
