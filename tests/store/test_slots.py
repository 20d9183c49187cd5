"""Slot claims: one replica per slot, takeover after expiry, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kvwatch.canary.model import ProbeState
from kvwatch.store.engine import create_engine_for
from kvwatch.store.migrate import upgrade_engine
from kvwatch.store.records import NewProbe
from tests.helpers.store import Store, get_probe


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def clocked_store(db_url: str, clock: Clock) -> Store:
    engine = create_engine_for(db_url)
    upgrade_engine(engine)
    return Store(engine, now=clock)


def test_only_the_first_replica_gets_a_slot(db_url):
    """Two claims on one slot: the first wins, the second is told no."""
    store = clocked_store(db_url, Clock())
    assert store.claim_slot("ep", "under", 1000, "a", ttl=60)
    assert not store.claim_slot("ep", "under", 1000, "b", ttl=60)
    assert store.claim_slot("ep", "under", 1060, "b", ttl=60)
    assert store.claim_slot("ep", "over", 1000, "b", ttl=60)


def test_a_done_slot_is_never_taken_over(db_url):
    """Completion is final, even after the claim's expiry."""
    clock = Clock()
    store = clocked_store(db_url, clock)
    assert store.claim_slot("ep", "under", 1000, "a", ttl=60)
    store.complete_slot("ep", "under", 1000, None)
    clock.now += timedelta(minutes=5)
    assert not store.claim_slot("ep", "under", 1000, "b", ttl=60)
    assert store.expired_slots(0) == []


def test_an_expired_claim_is_taken_over_and_the_dead_replicas_probe_interrupted(db_url):
    """A replica that died mid-probe: its claim expires, another takes the slot over."""
    clock = Clock()
    store = clocked_store(db_url, clock)
    eid = store.upsert_endpoint("ep", "http://h/v1", "openai", "m", 4096, None, {})
    assert store.claim_slot("ep", "under", 1000, "a", ttl=60)
    dead = store.begin_probe(
        NewProbe(
            endpoint="ep",
            endpoint_id=eid,
            kind="under",
            started_at=clock.now,
            replica="a",
            model="m",
            planned_prompt_tokens=1,
            target_prompt_tokens=1,
            max_tokens=1,
            token_source="server",
            tokenize_calls=1,
            marker="KVW-AAAA-BBBB-CCCC",
            marker_depth=0.0,
            streamed=True,
            slot=1000,
        )
    )
    clock.now += timedelta(seconds=30)
    assert not store.claim_slot("ep", "under", 1000, "b", ttl=60)  # still a's
    assert store.expired_slots(0) == []
    clock.now += timedelta(seconds=31)
    assert store.expired_slots(0) == [("ep", "under", 1000)]
    assert store.expired_slots(1001) == []
    assert store.claim_slot("ep", "under", 1000, "b", ttl=60)
    row = get_probe(store, dead)
    assert row is not None and row.state is ProbeState.INTERRUPTED and row.slot == 1000
    assert not store.claim_slot("ep", "under", 1000, "c", ttl=60)


def test_a_restarted_replica_frees_the_claims_it_was_killed_holding(db_url):
    """expire_claims makes a dead run's claims takeable at once, and only that replica's."""
    clock = Clock()
    store = clocked_store(db_url, clock)
    assert store.claim_slot("ep", "under", 1000, "a", ttl=600)
    assert store.claim_slot("ep", "over", 1000, "b", ttl=600)
    clock.now += timedelta(seconds=1)
    assert store.expire_claims("a") == 1
    clock.now += timedelta(seconds=1)
    assert store.claim_slot("ep", "under", 1000, "a", ttl=600)
    assert not store.claim_slot("ep", "over", 1000, "a", ttl=600)


def running_probe(eid: int, replica: str, marker: str, at: datetime) -> NewProbe:
    return NewProbe(
        endpoint="ep",
        endpoint_id=eid,
        kind="under",
        started_at=at,
        replica=replica,
        model="m",
        planned_prompt_tokens=0,
        target_prompt_tokens=0,
        max_tokens=1,
        token_source="server",
        tokenize_calls=0,
        marker=marker,
        marker_depth=0.0,
        streamed=True,
        slot=1000,
    )


def test_claim_and_begin_writes_the_row_only_for_the_replica_that_wins(db_url):
    """One transaction claims and begins: the winner's row runs, the loser writes nothing,
    and after expiry a takeover interrupts the dead replica's row and begins its own."""
    clock = Clock()
    store = clocked_store(db_url, clock)
    eid = store.upsert_endpoint("ep", "http://h/v1", "openai", "m", 4096, None, {})
    dead = store.claim_and_begin(running_probe(eid, "a", "KVW-AAAA-BBBB-CCCC", clock.now), 60)
    assert dead is not None
    lost = store.claim_and_begin(running_probe(eid, "b", "KVW-DDDD-EEEE-FFFF", clock.now), 60)
    assert lost is None
    assert [p.id for p in store.list_probes(endpoint="ep")] == [dead]
    issued = store.lookup_markers(["KVW-AAAA-BBBB-CCCC", "KVW-DDDD-EEEE-FFFF"])
    assert [m.probe_id for m in issued.values()] == [dead]  # the loser's marker was not kept

    clock.now += timedelta(seconds=61)
    taken = store.claim_and_begin(running_probe(eid, "b", "KVW-DDDD-EEEE-FFFF", clock.now), 60)
    assert taken is not None and taken != dead
    dead_row, new_row = get_probe(store, dead), get_probe(store, taken)
    assert dead_row is not None and dead_row.state is ProbeState.INTERRUPTED
    assert new_row is not None and new_row.state is ProbeState.RUNNING and new_row.replica == "b"
    assert store.expired_slots(0) == []
