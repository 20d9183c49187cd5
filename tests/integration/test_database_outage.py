"""A database outage loses no results: probing goes on, results wait and are written later."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import text

from kvwatch.store.engine import create_engine_for
from tests.helpers.processes import free_port, simulator_process, start_kvwatch, stop, wait_for


class PrivatePostgres:
    """A PostgreSQL server of this test's own (initdb into a temporary directory, run as the
    ``postgres`` user on a free port), so restarting it cuts no other test's connections,
    nor those of anyone else sharing the machine's server."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="kvwatch-outage-pg-"))
        shutil.chown(self.root, user="postgres")
        self.data = self.root / "data"
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self._as_postgres(
            "initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"
        )

    def _as_postgres(self, tool: str, *args: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", str(self.bindir / tool), *args],
            check=True,
            timeout=60,
            capture_output=True,
        )

    def start(self) -> None:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root}"
        log = str(self.root / "server.log")
        self._as_postgres("pg_ctl", "-D", str(self.data), "-l", log, "-o", options, "-w", "start")

    def stop(self) -> None:
        # Fast shutdown, as pg_ctlcluster does: open sessions are cut, not waited for.
        self._as_postgres("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def close(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def postgres_bindir() -> Path | None:
    """The newest installed PostgreSQL's server binaries (Debian layout), if any."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: [int(n) for n in p.parents[1].name.split(".") if n.isdigit()],
    )
    return found[-1].parent if found else None


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    bindir = postgres_bindir()
    if bindir is None or os.geteuid() != 0:
        reason = "a private PostgreSQL needs root and the server binaries (initdb, pg_ctl)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set)")
        pytest.skip(reason)
    server = PrivatePostgres(bindir)
    try:
        server.start()
        yield server
    finally:
        server.close()


# The result buffer retries the database every 5 s.
RETRY_SECONDS = 5


def events(log: Path) -> list[dict[str, Any]]:
    """The daemon's JSON log lines so far (a line still being written is left out)."""
    found = []
    for line in log.read_text().splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                found.append(json.loads(line))
    return found


def count(log: Path, event: str, **fields: str) -> int:
    return sum(
        1
        for e in events(log)
        if e.get("event") == event and all(e.get(k) == v for k, v in fields.items())
    )


@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_postgresql_restarted_mid_run_loses_no_result(tmp_path, private_postgres):
    """Every probe the daemon logged as finished is in the database after a restart of it."""
    log = tmp_path / "run.log"
    sims = [f"name=e{i},window=2048" for i in range(5)]
    with simulator_process(*sims, log=tmp_path / "sim.log") as sim:
        doc = {
            "database": private_postgres.url,
            "listen": f"127.0.0.1:{free_port()}",
            "defaults": {
                "interval": "2s",
                "jitter": "0s",
                "baseline_tokens": 256,
                "confirm": False,
            },
            "endpoints": [
                {
                    "name": f"e{i}",
                    "url": f"{sim}/e{i}/v1",
                    "model": "sim-1",
                    "context_window": 2048,
                    "probes": ["baseline", "over"],
                }
                for i in range(5)
            ],
        }
        (tmp_path / "kvwatch.yaml").write_text(yaml.safe_dump(doc))
        proc = start_kvwatch("run", "--config", str(tmp_path / "kvwatch.yaml"), log=log)
        try:
            # Polled, not slept: each phase lasts until the log shows what it is for.
            wait_for("20 probes before the outage", lambda: count(log, "probe") >= 20, timeout=60)
            private_postgres.stop()
            try:
                before = count(log, "probe")
                wait_for(
                    "a result that could not be stored",
                    lambda: count(log, "database_unavailable", during="finish_probe"),
                )
                # Longer than a retry period, so a flush also fails while the server is down.
                time.sleep(RETRY_SECONDS + 1)
                wait_for("10 probes during the outage", lambda: count(log, "probe") >= before + 10)
            finally:
                private_postgres.start()
            wait_for(
                "the buffered results to be flushed",
                lambda: count(log, "results_flushed"),
                timeout=4 * RETRY_SECONDS,
            )
            after = count(log, "probe")
            wait_for("10 more probes after the flush", lambda: count(log, "probe") >= after + 10)
        finally:
            assert stop(proc) == 0, log.read_text()[-3000:]

    finished = [e for e in events(log) if e.get("event") == "probe"]
    assert count(log, "database_unavailable"), "no outage seen"
    engine = create_engine_for(private_postgres.url)
    with engine.connect() as c:
        stored = c.execute(text("SELECT count(*) FROM probes WHERE state = 'done'")).scalar_one()
    engine.dispose()
    print(f"finished {len(finished)}, stored {stored}")
    assert len(finished) > 40
    assert stored == len(finished)
