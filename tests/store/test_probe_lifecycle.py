"""A probe row is written before its request and completed after it, evidence intact."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest

from kvwatch.canary.markers import canonical
from kvwatch.canary.model import ForeignMarker, ProbeState
from kvwatch.store import NewProbe, ProbeOutcome, StoreError
from tests.helpers.store import Store, get_probe

NewProbeFactory = Callable[..., NewProbe]
OutcomeFactory = Callable[..., ProbeOutcome]


def test_a_begun_probe_is_stored_running_with_every_planned_field(
    store: Store, new_probe: NewProbeFactory
) -> None:
    """begin_probe stores the plan as a running row and returns its id."""
    p = new_probe(kind="over", marker_depth=0.25, streamed=False, token_source="hf:/t.json")
    probe_id = store.begin_probe(p)
    row = get_probe(store, probe_id)
    assert row is not None
    assert row.id == probe_id
    assert row.state is ProbeState.RUNNING
    assert (row.verdict, row.reason, row.finished_at) == (None, None, None)
    assert (row.endpoint, row.endpoint_id, row.kind) == (p.endpoint, p.endpoint_id, "over")
    assert row.started_at == p.started_at
    assert row.started_at.tzinfo is not None
    assert (row.replica, row.model, row.token_source) == (p.replica, p.model, "hf:/t.json")
    assert (row.planned_prompt_tokens, row.target_prompt_tokens) == (131056, 131056)
    assert (row.max_tokens, row.tokenize_calls) == (16, 1)
    assert (row.marker, row.marker_depth, row.streamed) == (p.marker, 0.25, False)
    assert row.foreign_markers == ()
    assert row.confirms_probe_id is None


def test_a_finished_probe_keeps_every_evidence_field_exactly(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory
) -> None:
    """finish_probe round-trips all evidence: aware timestamps, JSON foreign markers, text."""
    leaked_from = new_probe(endpoint="other", started_at=datetime(2026, 2, 28, 23, 0, tzinfo=UTC))
    leaked_id = store.begin_probe(leaked_from)
    original = store.begin_probe(new_probe())
    probe_id = store.begin_probe(new_probe(confirms_probe_id=original))
    # A non-UTC offset on the way in must come back as the same instant, in UTC.
    issued = datetime(2026, 3, 1, 13, 30, 5, 250000, tzinfo=timezone(timedelta(hours=2)))
    foreign = ForeignMarker(
        marker=leaked_from.marker, probe_id=leaked_id, endpoint="other", issued_at=issued
    )
    finished = datetime(2026, 3, 1, 14, 0, 0, 999999, tzinfo=timezone(timedelta(hours=-5)))
    result = make_outcome(
        "foreign_marker",
        reason="answer holds a marker issued to probe 1",
        finished_at=finished,
        reported_prompt_tokens=1,
        completion_tokens=12,
        marker_found=False,
        foreign_markers=[foreign],
        http_status=200,
        finish_reason="length",
        answer_excerpt='The code is "KVW-AAAA-BBBB-CCCC" — ünïcødé ok',
        error_body=None,
        error_detail="no error",
        ttfb_seconds=0.125,
        duration_seconds=3.5,
    )
    store.finish_probe(probe_id, result)

    row = get_probe(store, probe_id)
    assert row is not None
    assert row.state is ProbeState.DONE
    assert row.verdict == "foreign_marker"
    assert row.reason == result.reason
    assert row.finished_at == finished
    assert row.finished_at is not None and row.finished_at.utcoffset() == timedelta(0)
    assert (row.reported_prompt_tokens, row.completion_tokens) == (1, 12)
    assert row.marker_found is False
    assert row.foreign_markers == (foreign,)
    assert row.foreign_markers[0].issued_at.utcoffset() == timedelta(0)
    assert (row.http_status, row.finish_reason) == (200, "length")
    assert row.answer_excerpt == result.answer_excerpt
    assert (row.error_body, row.error_detail) == (None, "no error")
    assert (row.ttfb_seconds, row.duration_seconds) == (0.125, 3.5)
    assert row.confirms_probe_id == original


def test_an_unknown_probe_id_reads_as_none(store: Store) -> None:
    """get_probe of an id never issued returns None rather than raising."""
    assert get_probe(store, 987654) is None


def test_issued_markers_are_found_by_canonical_form(
    store: Store, new_probe: NewProbeFactory
) -> None:
    """lookup_markers names the probe, endpoint and time a marker was issued to."""
    p = new_probe(endpoint="glm-canary", started_at=datetime(2026, 3, 1, 9, 0, tzinfo=UTC))
    probe_id = store.begin_probe(p)
    never_issued = "0000000000ZZ"
    found = store.lookup_markers([canonical(p.marker), never_issued])
    assert found == {
        canonical(p.marker): ForeignMarker(
            marker=p.marker, probe_id=probe_id, endpoint="glm-canary", issued_at=p.started_at
        )
    }


def test_marker_lookup_tolerates_the_noisy_spellings_an_answer_holds(
    store: Store, new_probe: NewProbeFactory
) -> None:
    """A lowercase, respaced spelling of an issued marker still resolves to its probe."""
    p = new_probe()
    probe_id = store.begin_probe(p)
    noisy = p.marker.lower().replace("-", " ")
    assert store.lookup_markers([noisy])[canonical(p.marker)].probe_id == probe_id
    assert store.lookup_markers([]) == {}


def test_a_reused_marker_is_refused_and_no_probe_row_is_left(
    store: Store, new_probe: NewProbeFactory
) -> None:
    """begin_probe writes probe and marker in one transaction: a duplicate marker writes neither."""
    first = new_probe()
    store.begin_probe(first)
    with pytest.raises(StoreError, match="could not record the start of a probe"):
        store.begin_probe(new_probe(marker=first.marker))
    assert len(store.list_probes()) == 1


def test_an_interrupted_probe_cannot_be_finished(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory
) -> None:
    """A row marked interrupted (its replica presumed dead) refuses a late result."""
    probe_id = store.begin_probe(new_probe())
    assert store.interrupt_running(reason="replica restarted") == 1
    row = get_probe(store, probe_id)
    assert row is not None
    assert row.state is ProbeState.INTERRUPTED
    assert row.reason == "replica restarted"
    assert row.finished_at is not None and row.finished_at.tzinfo is not None
    with pytest.raises(StoreError, match=f"probe {probe_id}: it is interrupted, not running"):
        store.finish_probe(probe_id, make_outcome())
    after = get_probe(store, probe_id)
    assert after is not None and after.verdict is None


def test_a_probe_cannot_be_finished_twice_or_before_it_exists(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory
) -> None:
    """Only a running row can be finished: done rows and missing ids raise."""
    probe_id = store.begin_probe(new_probe())
    store.finish_probe(probe_id, make_outcome())
    with pytest.raises(StoreError, match="it is done, not running"):
        store.finish_probe(probe_id, make_outcome("error"))
    with pytest.raises(StoreError, match="no such probe"):
        store.finish_probe(probe_id + 1000, make_outcome())
    row = get_probe(store, probe_id)
    assert row is not None and row.verdict == "pass"


def test_interrupting_selects_by_replica_or_by_id(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory
) -> None:
    """interrupt_running touches only running rows of the given replica, or the given ids."""
    a0 = store.begin_probe(new_probe(replica="a"))
    a1 = store.begin_probe(new_probe(replica="a"))
    b0 = store.begin_probe(new_probe(replica="b"))
    b1 = store.begin_probe(new_probe(replica="b"))
    done = store.begin_probe(new_probe(replica="a"))
    store.finish_probe(done, make_outcome())

    assert store.interrupt_running(probe_ids=[], reason="nothing") == 0
    assert store.interrupt_running(probe_ids=[b0, done], reason="shutdown") == 1
    assert store.interrupt_running("a", reason="replica a restarted") == 2
    states = {pid: get_probe(store, pid) for pid in (a0, a1, b0, b1, done)}
    assert {pid: r.state for pid, r in states.items() if r} == {
        a0: ProbeState.INTERRUPTED,
        a1: ProbeState.INTERRUPTED,
        b0: ProbeState.INTERRUPTED,
        b1: ProbeState.RUNNING,
        done: ProbeState.DONE,
    }
    assert store.interrupt_running(reason="everything") == 1


def test_naive_timestamps_are_refused(store: Store, new_probe: NewProbeFactory) -> None:
    """A naive datetime would be stored in an unknown zone, so the store refuses it."""
    with pytest.raises(StoreError, match="naive datetime"):
        store.begin_probe(new_probe(started_at=datetime(2026, 3, 1, 12, 0)))
