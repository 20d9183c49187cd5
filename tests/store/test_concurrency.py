"""The daemon writes from several threads at once (asyncio.to_thread); none may fail."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

from kvwatch.store import NewProbe, ProbeOutcome
from tests.helpers.store import Store

NewProbeFactory = Callable[..., NewProbe]
OutcomeFactory = Callable[..., ProbeOutcome]

WORKERS = 4
PROBES_PER_WORKER = 15


def test_concurrent_probe_writes_and_pruning_all_succeed(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory, t0: datetime
) -> None:
    """Parallel begin/finish cycles and a concurrent prune wait for each other, never fail."""
    old = [store.begin_probe(new_probe(started_at=t0 - timedelta(days=90))) for _ in range(30)]
    store.interrupt_running(probe_ids=old, reason="old")
    # Built up front: the factory's endpoint cache is not meant for threads.
    plans = [[new_probe() for _ in range(PROBES_PER_WORKER)] for _ in range(WORKERS)]

    def cycle(plan: list[NewProbe]) -> list[int]:
        ids = []
        for p in plan:
            probe_id = store.begin_probe(p)
            store.finish_probe(probe_id, make_outcome())
            ids.append(probe_id)
        return ids

    with ThreadPoolExecutor(WORKERS + 1) as pool:
        pruned = pool.submit(store.prune, t0 - timedelta(days=30), batch=3)
        written = [pool.submit(cycle, plan) for plan in plans]
        ids = [probe_id for future in written for probe_id in future.result()]
        assert pruned.result() == len(old)

    rows = store.list_probes(limit=1000)
    assert sorted(row.id for row in rows) == sorted(ids)
    assert {row.verdict for row in rows} == {"pass"}
