"""A scheduled probe costs two database transactions: claim + start, result + slot done.

Real HTTP to the simulator, the real runner and the real store (SQLite and PostgreSQL); the
transactions are counted with SQLAlchemy's engine events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sqlalchemy import event, text

from kvwatch.canary.model import ProbeKind, ProbeState, Verdict
from kvwatch.probe.model import Target
from kvwatch.probe.runner import ProbeRunner
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from kvwatch.store.errors import StoreUnavailable
from kvwatch.store.repository import Store, WriteOp
from tests.helpers.store import get_probe
from tests.helpers.targets import config_for, sim_endpoint_entry, targets_and_runner

SLOT = 1_700_000_040
FLEET = [
    SimEndpoint("healthy", window=4096),
    SimEndpoint("over-ok", window=4096, fault=FaultMode.ACCEPT_OVER_LIMIT),
]


@dataclass
class Transactions:
    """Transactions begun and committed on an engine while counting."""

    begun: int = 0
    committed: int = 0


@pytest.fixture
def transactions(store: Store) -> Iterator[Transactions]:
    counted = Transactions()

    def on_begin(_conn: Any) -> None:
        counted.begun += 1

    def on_commit(_conn: Any) -> None:
        counted.committed += 1

    event.listen(store.engine, "begin", on_begin)
    event.listen(store.engine, "commit", on_commit)
    yield counted
    event.remove(store.engine, "begin", on_begin)
    event.remove(store.engine, "commit", on_commit)


@dataclass
class Fleet:
    targets: dict[str, Target]
    runner: ProbeRunner
    sent: list[httpx.Request]  # every request kvwatch sent to the simulator


@pytest.fixture
async def fleet(store: Store) -> AsyncIterator[Fleet]:
    sent: list[httpx.Request] = []

    async def record(request: httpx.Request) -> None:
        sent.append(request)

    async with (
        run_simulator(FLEET) as sim,
        httpx.AsyncClient(timeout=None, event_hooks={"request": [record]}) as client,
    ):
        entries = [sim_endpoint_entry(sim, e.name, probes=["over"]) for e in FLEET]
        config = config_for(entries, database="sqlite:///unused.db")
        targets, runner, _ = targets_and_runner(config, store, client)
        yield Fleet(targets, runner, sent)


def slot_row(store: Store, endpoint: str, kind: str) -> tuple[Any, ...] | None:
    with store.engine.connect() as c:
        row = c.execute(
            text(
                "SELECT replica, done, probe_id FROM probe_slots "
                "WHERE endpoint = :e AND kind = :k AND slot = :s"
            ),
            {"e": endpoint, "k": kind, "s": SLOT},
        ).first()
    return None if row is None else tuple(row)


async def test_a_scheduled_probe_takes_two_transactions(store, fleet, transactions):
    """A healthy slot: one transaction claims it and starts the probe, one stores the result
    and marks the slot done (it used to take four)."""
    reports = await fleet.runner.run_slot(fleet.targets["healthy"], ProbeKind.OVER, SLOT)
    assert [r.verdict for r in reports] == [Verdict.PASS]
    assert (transactions.begun, transactions.committed) == (2, 2)
    assert slot_row(store, "healthy", "over") == ("test-replica", True, reports[0].probe_id)
    row = get_probe(store, reports[0].probe_id)
    assert row is not None and row.state is ProbeState.DONE and row.slot == SLOT
    # What planning settled after the row was begun is stored with the result.
    assert row.planned_prompt_tokens == reports[0].planned_prompt_tokens
    assert row.planned_prompt_tokens > 4000 and row.tokenize_calls >= 1


async def test_a_slot_held_by_another_replica_writes_nothing_and_sends_nothing(
    store, fleet, transactions
):
    """The losing replica's one transaction (its claim) writes no probe row, and it plans
    nothing: no tokenize call, no canary."""
    assert store.claim_slot("healthy", "over", SLOT, "other-replica", ttl=60)
    transactions.begun = transactions.committed = 0
    assert await fleet.runner.run_slot(fleet.targets["healthy"], ProbeKind.OVER, SLOT) == []
    assert transactions.begun == 1
    assert fleet.sent == []
    assert store.list_probes(endpoint="healthy") == []
    assert slot_row(store, "healthy", "over") == ("other-replica", False, None)


async def test_a_confirmed_slot_is_done_only_with_its_confirmation(store, fleet):
    """A critical verdict is confirmed in the same slot: the slot is marked done with the
    confirmation's result, not the first probe's."""
    reports = await fleet.runner.run_slot(fleet.targets["over-ok"], ProbeKind.OVER, SLOT)
    assert [r.verdict for r in reports] == [Verdict.OVER_ACCEPTED] * 2
    first, confirmation = reports
    assert confirmation.confirms_probe_id == first.probe_id
    assert slot_row(store, "over-ok", "over") == ("test-replica", True, confirmation.probe_id)


async def test_a_result_buffered_in_an_outage_completes_its_slot_when_written(
    store, fleet, monkeypatch
):
    """The database is down when the result is ready: the result waits in the buffer, the
    slot stays undone, and writing the result later marks the slot done with it."""
    runner = fleet.runner
    finish = store.finish_probe_op

    def refused(_session: Any) -> None:
        raise StoreUnavailable("could not finish probe: connection refused")

    def down(*args: Any, **kwargs: Any) -> WriteOp[None]:
        return WriteOp("could not finish probe", refused)

    monkeypatch.setattr(store, "finish_probe_op", down)
    reports = await runner.run_slot(fleet.targets["healthy"], ProbeKind.OVER, SLOT)
    assert len(runner.results) == 1
    assert slot_row(store, "healthy", "over") == ("test-replica", False, None)
    row = get_probe(store, reports[0].probe_id)
    assert row is not None and row.state is ProbeState.RUNNING

    monkeypatch.setattr(store, "finish_probe_op", finish)
    assert await runner.results.flush()
    assert slot_row(store, "healthy", "over") == ("test-replica", True, reports[0].probe_id)
    row = get_probe(store, reports[0].probe_id)
    assert row is not None and row.state is ProbeState.DONE and row.verdict == "pass"
