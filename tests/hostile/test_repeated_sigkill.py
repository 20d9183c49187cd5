"""Repeated SIGKILL of a real `kvwatch run`: no probe row is ever left `running`.

The daemon (SQLite) probes a slow simulator endpoint (1.5 s to first byte) and is killed five
times at random moments — some while starting up, some with a probe in flight — and started
again each time; a last run ends with SIGTERM. Every row must then be `done` (with a verdict)
or `interrupted` (with a reason), and SQLite must find the file intact.
"""

from __future__ import annotations

import random
import signal
import sqlite3
import time
from pathlib import Path

import yaml

from tests.helpers.processes import free_port, simulator_process, start_kvwatch, stop, wait_for

KILLS = 5


def count(db: Path, where: str) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            return int(conn.execute(f"SELECT count(*) FROM probes WHERE {where}").fetchone()[0])
    except sqlite3.Error:
        return 0  # not migrated yet, or locked for a moment


def max_id(db: Path) -> int:
    """The newest probe id so far (0 before the first)."""
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            return int(conn.execute("SELECT coalesce(max(id), 0) FROM probes").fetchone()[0])
    except sqlite3.Error:
        return 0


def test_every_probe_row_is_done_or_interrupted_after_repeated_sigkills(tmp_path: Path) -> None:
    """Five SIGKILLs at random moments, restarts, then SIGTERM: no row is left running."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    db = tmp_path / "kvwatch.db"
    log = tmp_path / "run.log"
    with simulator_process("name=slow,window=4096,ttfb_delay=1.5", log=tmp_path / "sim.log") as sim:
        config = {
            "database": f"sqlite:///{db}",
            "listen": f"127.0.0.1:{free_port()}",
            "replica": "sigkill-test",
            "defaults": {"interval": "4s", "jitter": "0s", "confirm": False},
            "endpoints": [
                {
                    "name": "slow",
                    "url": f"{sim}/slow/v1",
                    "model": "sim-1",
                    "context_window": 4096,
                    "probes": ["under", "over", "baseline"],
                }
            ],
        }
        path = tmp_path / "kvwatch.yaml"
        path.write_text(yaml.safe_dump(config))
        moments = []
        for round_ in range(KILLS):
            newest = max_id(db)  # before the start, so every row of this run is newer
            proc = start_kvwatch("run", "--config", str(path), log=log)
            if round_ % 2:
                # Mid-probe: a row of this run is running, then a random point of its 1.5 s
                # wait. Only under and baseline wait: the simulator rejects an over probe at
                # once, and a row left running by the last kill is not this run's.
                try:
                    wait_for(
                        "a new running under or baseline probe",
                        lambda newest=newest: count(
                            db, f"state = 'running' AND kind != 'over' AND id > {newest}"
                        ),
                        timeout=60,
                        every=0.05,
                    )
                except AssertionError as exc:
                    # Say why: the daemon's own log (a start that failed says so there).
                    tail = log.read_text()[-3000:]
                    raise AssertionError(
                        f"{exc}; seed {seed}, kills so far {moments}\n{tail}"
                    ) from None
                delay = rng.uniform(0.0, 1.2)
            else:
                delay = rng.uniform(0.3, 4.0)  # anywhere: imports, migration, scheduling
            time.sleep(delay)
            stop(proc, signal.SIGKILL)
            moments.append(round(delay, 2))
        proc = start_kvwatch("run", "--config", str(path), log=log)
        done_before = count(db, "state = 'done'")
        wait_for(
            "a probe completed after the kills",
            lambda: count(db, "state = 'done'") > done_before,
            timeout=60,
        )
        assert stop(proc) == 0, log.read_text()[-3000:]

    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        states = dict(conn.execute("SELECT state, count(*) FROM probes GROUP BY state").fetchall())
        incomplete = conn.execute(
            "SELECT id, state, verdict, reason, finished_at FROM probes WHERE "
            "(state = 'done' AND (verdict IS NULL OR finished_at IS NULL)) OR "
            "(state = 'interrupted' AND (reason IS NULL OR finished_at IS NULL)) OR "
            "state NOT IN ('done', 'interrupted')"
        ).fetchall()
        orphan_markers = conn.execute(
            "SELECT count(*) FROM markers WHERE probe_id NOT IN (SELECT id FROM probes)"
        ).fetchone()[0]
    print(f"seed {seed}, kill moments {moments} s, rows by state {states}")
    assert not incomplete, (seed, incomplete)
    assert orphan_markers == 0
    # The mid-probe kills really hit probes in flight.
    assert states.get("interrupted", 0) >= KILLS // 2, (seed, states)
