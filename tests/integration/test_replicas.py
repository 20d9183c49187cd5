"""Several replicas on one PostgreSQL: each probe slot runs exactly once, even when one dies."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from sqlalchemy import text

from kvwatch.store.engine import create_engine_for
from tests.helpers.processes import free_port, simulator_process, start_kvwatch, stop

ENDPOINTS = 30
KINDS = ("baseline", "over")
INTERVAL = 3
# Counted slots: 18 slot times × 30 endpoints × 2 kinds = 1,080.
SLOT_TIMES = 18
# Two counted slot times have run by then (the first starts ≤ 15 s in), so r2 has done some.
KILL_AFTER = 21
# A dead replica's claim expires after two 2 s deadlines + 30 s; live replicas sweep every 15 s.
SWEEP_SECONDS = 15
# The old fixed schedule ended the run 139 s in; recovery never needs longer than that.
RECOVERY_DEADLINE = 140


def replica_config(path: Path, db_url: str, sim: str, replica: str) -> Path:
    doc = {
        "database": db_url,
        "listen": f"127.0.0.1:{free_port()}",
        "replica": replica,
        "defaults": {
            "interval": f"{INTERVAL}s",
            "jitter": "0s",
            "baseline_tokens": 256,
            "confirm": False,
            "timeouts": {"baseline": "2s", "over": "2s", "under": "2s"},
        },
        "endpoints": [
            {
                "name": f"e{i}",
                "url": f"{sim}/e{i}/v1",
                "model": "sim-1",
                "context_window": 2048,
                "probes": list(KINDS),
            }
            for i in range(ENDPOINTS)
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def done_runs(url: str) -> list[tuple[str, str, int, str]]:
    """(endpoint, kind, slot, replica) of every finished probe."""
    engine = create_engine_for(url)
    try:
        with engine.connect() as c:
            rows = c.execute(
                text("SELECT endpoint, kind, slot, replica FROM probes WHERE state = 'done'")
            ).all()
    finally:
        engine.dispose()
    return [(e, k, s, r) for e, k, s, r in rows if s is not None]


@pytest.mark.postgres
@pytest.mark.timeout(600)
def test_three_replicas_run_every_slot_exactly_once_with_one_killed(tmp_path, postgres_schema_url):
    """≥1,000 slots, three replicas, one SIGKILLed mid-run: 0 duplicates and 0 lost."""
    sims = [f"name=e{i},window=2048" for i in range(ENDPOINTS)]
    with simulator_process(*sims, log=tmp_path / "sim.log") as sim:
        procs = {}
        for name in ("r1", "r2", "r3"):
            cfg = replica_config(tmp_path / f"{name}.yaml", postgres_schema_url, sim, name)
            procs[name] = start_kvwatch("run", "--config", str(cfg), log=tmp_path / f"{name}.log")
            time.sleep(1)  # let the first replica migrate the schema before the others race
        started = time.time()
        # Every job has had its first (randomly delayed) run by then.
        first = (int(started) // INTERVAL + 5) * INTERVAL
        last = first + (SLOT_TIMES - 1) * INTERVAL
        expected = {
            (f"e{i}", kind, slot)
            for i in range(ENDPOINTS)
            for kind in KINDS
            for slot in range(first, last + 1, INTERVAL)
        }
        time.sleep(KILL_AFTER)
        stop(procs["r2"], signal.SIGKILL)
        # Polled, not slept: done once every counted slot has run, the killed replica's
        # in-flight ones included (their claims expire, then a sweep retries them).
        while time.time() < started + RECOVERY_DEADLINE:
            if not expected - {(e, k, s) for e, k, s, _ in done_runs(postgres_schema_url)}:
                break
            time.sleep(1)
        complete_after = time.time() - started
        # One more sweep of each live replica after the last retry: a retried slot that was
        # not marked done would be run again by it and show up as a duplicate.
        time.sleep(SWEEP_SECONDS + 2)
        for name in ("r1", "r3"):
            assert stop(procs[name]) == 0, (tmp_path / f"{name}.log").read_text()

    done = done_runs(postgres_schema_url)
    runs = Counter((e, k, s) for e, k, s, _ in done if first <= s <= last)
    duplicates = {key: n for key, n in runs.items() if n > 1}
    lost = expected - set(runs)
    by_replica = Counter(r for e, k, s, r in done if first <= s <= last)
    print(
        f"slots {len(expected)}, runs {sum(runs.values())}, by replica {dict(by_replica)}, "
        f"all run {complete_after:.0f} s after the start"
    )
    assert len(expected) >= 1000
    assert duplicates == {}
    assert lost == set(), sorted(lost)[:10]
    assert by_replica["r2"] > 0 and by_replica["r1"] > 0 and by_replica["r3"] > 0
