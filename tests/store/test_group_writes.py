"""Grouped probe writes: one commit for many, and a refused or conflicting write fails alone."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from kvwatch.canary.model import ProbeState
from kvwatch.store.errors import StoreError, StoreUnavailable
from kvwatch.store.repository import WriteOp
from kvwatch.store.writer import GroupWriter
from tests.helpers.store import Store, get_probe
from tests.store.conftest import NewProbeFactory, outcome


def _count_commits(store: Store) -> list[int]:
    commits = [0]

    def on_commit(_connection: Any) -> None:
        commits[0] += 1

    event.listen(store.engine, "commit", on_commit)
    return commits


class _Orig(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(f"sqlstate {sqlstate}")
        self.sqlstate = sqlstate


def _failing(sqlstate: str) -> WriteOp[None]:
    def run(_session: Session) -> None:
        raise OperationalError("UPDATE probes ...", {}, _Orig(sqlstate))

    return WriteOp("could not finish probe 0", run, "zz")


def test_a_group_of_probe_writes_is_one_commit(store: Store, new_probe: NewProbeFactory):
    """Three starts and a finish: four results in the order given, one commit."""
    first = store.begin_probe(new_probe(endpoint="a"))
    c, b_slot, b = (
        new_probe(endpoint="c"),
        new_probe(endpoint="b", slot=60),
        new_probe(endpoint="b"),
    )
    ops: list[WriteOp[Any]] = [
        store.begin_probe_op(c),
        store.finish_probe_op(first, outcome(), endpoint="a"),
        store.claim_and_begin_op(b_slot, ttl=60),
        store.begin_probe_op(b),
    ]
    commits = _count_commits(store)
    results = store.write_group(ops)
    assert commits == [1]
    assert isinstance(results[0], int) and results[1] is None
    assert isinstance(results[2], int) and isinstance(results[3], int)
    for probe_id in (results[0], results[2], results[3]):
        row = get_probe(store, probe_id)
        assert row is not None and row.state is ProbeState.RUNNING
    done = get_probe(store, first)
    assert done is not None and done.state is ProbeState.DONE


def test_a_refused_write_fails_alone_and_the_rest_of_its_group_is_written(
    store: Store, new_probe: NewProbeFactory
):
    """Finishing a probe twice is refused; the start beside it in the group still lands."""
    probe_id = store.begin_probe(new_probe(endpoint="a"))
    store.finish_probe(probe_id, outcome())
    results = store.write_group(
        [
            store.finish_probe_op(probe_id, outcome("marker_missing"), endpoint="a"),
            store.begin_probe_op(new_probe(endpoint="b")),
        ]
    )
    assert isinstance(results[0], StoreError) and "not running" in str(results[0])
    assert isinstance(results[1], int)
    row = get_probe(store, probe_id)
    assert row is not None and row.verdict == "pass"


def test_a_group_that_lost_a_deadlock_is_retried_write_by_write(
    store: Store, new_probe: NewProbeFactory
):
    """PostgreSQL's deadlock (40P01) is a lost race, not an outage: the other writes of the
    group are written one by one (a start must not be reported unwritten, which would run
    its slot unclaimed)."""
    results = store.write_group([store.begin_probe_op(new_probe(endpoint="a")), _failing("40P01")])
    assert isinstance(results[0], int)
    assert isinstance(results[1], StoreUnavailable)
    assert get_probe(store, results[0]) is not None


def test_an_unreachable_database_fails_the_whole_group_at_once(
    store: Store, new_probe: NewProbeFactory
):
    """A connection error (no SQLSTATE of a conflict) is not retried write by write: each
    retry would wait out its own connect timeout."""
    op = store.begin_probe_op(new_probe(endpoint="a"))
    commits = _count_commits(store)
    results = store.write_group([op, _failing("08006")])
    assert all(isinstance(r, StoreUnavailable) for r in results)
    assert commits == [0]


async def test_writes_waiting_together_share_a_commit_and_each_gets_its_own_result(
    store: Store, new_probe: NewProbeFactory
):
    """Forty starts sent at once through the writer take fewer commits than writes, and
    every caller gets its own probe id; a refused write raises in its caller only."""
    writer = GroupWriter(store, idle_exit=0.2)
    done_id = store.begin_probe(new_probe(endpoint="a"))
    store.finish_probe(done_id, outcome())
    probes = [new_probe(endpoint=f"e{i}") for i in range(40)]
    commits = _count_commits(store)
    starts = [writer.write(store.begin_probe_op(p)) for p in probes]
    refused = writer.write(store.finish_probe_op(done_id, outcome(), endpoint="a"))
    *ids, error = await asyncio.gather(*starts, refused, return_exceptions=True)
    assert isinstance(error, StoreError)
    assert len(set(ids)) == 40 and all(isinstance(i, int) for i in ids)
    assert commits[0] < 40
    await asyncio.sleep(0.5)
    # Idle: the thread has ended, and the next write starts another.
    assert await writer.write(store.begin_probe_op(new_probe(endpoint="late"))) > 0


@pytest.mark.parametrize("sqlstate", ["40P01", "40001"])
def test_both_conflict_sqlstates_count_as_a_lost_race(
    store: Store, new_probe: NewProbeFactory, sqlstate: str
):
    """Deadlock and serialization failure both send the group to write-by-write."""
    results = store.write_group([store.begin_probe_op(new_probe(endpoint="a")), _failing(sqlstate)])
    assert isinstance(results[0], int)
