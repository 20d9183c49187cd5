"""A database outage loses no results: probing goes on, results wait and are written later."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from sqlalchemy import text

from kvwatch.store.engine import create_engine_for
from tests.helpers.processes import free_port, simulator_process, start_kvwatch, stop


def pg_cluster(action: str) -> None:
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action],
        check=True,
        timeout=60,
    )


def pg_ctl_available() -> bool:
    return Path("/etc/postgresql").is_dir() and os.geteuid() == 0


@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_postgresql_restarted_mid_run_loses_no_result(tmp_path, postgres_schema_url):
    """Every probe the daemon logged as finished is in the database after a restart of it."""
    if not pg_ctl_available():
        if os.environ.get("CI"):
            pytest.fail("restarting PostgreSQL needs root and pg_ctlcluster (CI is set)")
        pytest.skip("restarting PostgreSQL needs root and pg_ctlcluster")
    log = tmp_path / "run.log"
    sims = [f"name=e{i},window=2048" for i in range(5)]
    with simulator_process(*sims, log=tmp_path / "sim.log") as sim:
        doc = {
            "database": postgres_schema_url,
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
            time.sleep(15)
            pg_cluster("stop")
            try:
                time.sleep(10)
            finally:
                pg_cluster("start")
            time.sleep(20)  # the buffer flushes every 5 s once the database answers
        finally:
            assert stop(proc) == 0, log.read_text()[-3000:]

    events = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    finished = [e for e in events if e.get("event") == "probe"]
    assert any(e.get("event") == "database_unavailable" for e in events), "no outage seen"
    engine = create_engine_for(postgres_schema_url)
    with engine.connect() as c:
        stored = c.execute(text("SELECT count(*) FROM probes WHERE state = 'done'")).scalar_one()
    engine.dispose()
    print(f"finished {len(finished)}, stored {stored}")
    assert len(finished) > 40
    assert stored == len(finished)
