"""Changes are recorded once across replicas, and a flapping engine is held to the gap."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kvwatch.store import create_engine_for
from kvwatch.store.repository import Store

T0 = datetime(2026, 12, 5, 7, 0, tzinfo=UTC)
GAP = 600.0


def fp(version: str) -> dict[str, str]:
    return {"model": "glm", "context_window": "131072", "version": version}


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def replica_store(url: str, clock: Clock) -> Store:
    return Store(create_engine_for(url), now=clock)


def test_two_replicas_that_read_the_same_redeploy_record_one_change(
    store: Store, db_url: str
) -> None:
    """The compare-and-set on the fingerprint lets one replica record the change."""
    clock = Clock()
    r1, r2 = replica_store(db_url, clock), replica_store(db_url, clock)
    try:
        assert r1.observe_fingerprint("glm", fp("1"), replica="r1", min_gap_seconds=GAP) is None
        first = r1.observe_fingerprint("glm", fp("2"), replica="r1", min_gap_seconds=GAP)
        second = r2.observe_fingerprint("glm", fp("2"), replica="r2", min_gap_seconds=GAP)
        assert first is not None and second is None
        assert (first.reason, first.fields, first.state) == ("fingerprint", ("version",), "due")
        assert dict(first.before) == fp("1") and dict(first.after) == fp("2")
        assert [c.id for c in store.list_changes("glm")] == [first.id]
        assert [c.id for c in r2.due_changes(["glm"])] == [first.id]
        assert r2.mark_change_ran(first.id) is True
        assert r1.mark_change_ran(first.id) is False
    finally:
        r1.engine.dispose()
        r2.engine.dispose()


def test_a_flapping_engine_is_held_to_the_minimum_gap(db_url: str, store: Store) -> None:
    """After a change run, the next changes wait for the gap; only the latest of them runs,
    when the gap ends."""
    clock = Clock()
    r1 = replica_store(db_url, clock)
    try:
        r1.observe_fingerprint("glm", fp("1"), replica="r1", min_gap_seconds=GAP)
        first = r1.observe_fingerprint("glm", fp("2"), replica="r1", min_gap_seconds=GAP)
        assert first is not None and first.state == "due"
        assert r1.mark_change_ran(first.id)
        clock.now = T0 + timedelta(minutes=1)
        second = r1.observe_fingerprint("glm", fp("3"), replica="r1", min_gap_seconds=GAP)
        assert second is not None and second.state == "held"
        assert second.due_at == T0 + timedelta(seconds=GAP)
        clock.now = T0 + timedelta(minutes=2)
        third = r1.observe_fingerprint("glm", fp("4"), replica="r1", min_gap_seconds=GAP)
        assert third is not None and third.state == "held"
        clock.now = T0 + timedelta(minutes=9, seconds=59)
        assert r1.due_changes(["glm"]) == []
        clock.now = T0 + timedelta(minutes=10)
        assert [c.id for c in r1.due_changes(["glm"])] == [third.id]
        states = {c.id: c.state for c in r1.list_changes("glm")}
        assert states == {first.id: "ran", second.id: "superseded", third.id: "held"}
    finally:
        r1.engine.dispose()


def test_a_change_on_an_endpoint_with_on_change_off_is_kept_but_never_due(
    db_url: str, store: Store
) -> None:
    """on_change: false stores the event as history only."""
    store.observe_fingerprint("glm", fp("1"), replica="r1", min_gap_seconds=GAP, on_change=False)
    change = store.observe_fingerprint(
        "glm", fp("2"), replica="r1", min_gap_seconds=GAP, on_change=False
    )
    assert change is not None and change.state == "off"
    assert store.due_changes(["glm"]) == []


def test_a_skipped_slot_cannot_be_claimed_by_a_replica_afterwards(store: Store) -> None:
    """A change run marks the next scheduled slot done; its claim then fails."""
    assert store.skip_slot("glm", "under", 1_800_000_000, "r1") is True
    assert store.skip_slot("glm", "under", 1_800_000_000, "r2") is False
    assert store.claim_slot("glm", "under", 1_800_000_000, "r2", ttl=60) is False


def test_a_change_run_whose_replica_died_is_swept_like_a_scheduled_slot(
    db_url: str, store: Store
) -> None:
    """A change run's claim (slot -change_id) that expired undone is listed for a retry
    while recent, as a scheduled slot's is; an old one is not."""
    clock = Clock()
    r1 = replica_store(db_url, clock)
    try:
        assert r1.claim_slot("glm", "under", -7, "r1", ttl=30)
        clock.now = T0 + timedelta(minutes=1)
        since = int((T0 - timedelta(minutes=5)).timestamp())
        assert r1.expired_slots(since) == [("glm", "under", -7)]
        later = int((T0 + timedelta(seconds=1)).timestamp())
        assert r1.expired_slots(later) == []
    finally:
        r1.engine.dispose()
