"""The daemon as users run it: a real `kvwatch run` process, killed and restarted."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from kvwatch.canary.model import ProbeState
from kvwatch.store.engine import create_engine_for
from kvwatch.store.errors import StoreError
from kvwatch.store.repository import Store
from tests.helpers.processes import (
    free_port,
    kvwatch_cmd,
    simulator_process,
    start_kvwatch,
    stop,
    wait_for,
)
from tests.helpers.store import get_probe


def write_config(path: Path, db_url: str, sim: str, *, grace_probe: str = "baseline") -> Path:
    doc = {
        "database": db_url,
        "listen": f"127.0.0.1:{free_port()}",
        "replica": "lifecycle-test",
        "endpoints": [
            {
                "name": "slow",
                "url": f"{sim}/slow/v1",
                "model": "sim-1",
                "context_window": 4096,
                "probes": [grace_probe],
                "interval": "1h",
                "jitter": "0s",
                "confirm": False,
            }
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def rows(store: Store, state: ProbeState) -> list:
    """Probes in ``state``; empty while the daemon has not created the schema yet."""
    try:
        return store.list_probes(state=state)
    except StoreError:
        return []


@pytest.fixture
def observed(db_url: str):
    engine = create_engine_for(db_url)
    yield Store(engine)
    engine.dispose()


def test_sigkill_mid_probe_leaves_an_interrupted_row_and_the_next_start_carries_on(
    tmp_path, db_url, observed
):
    """A killed daemon's running row is marked interrupted on restart, and probing resumes."""
    log = tmp_path / "run.log"
    with simulator_process("name=slow,window=4096,ttfb_delay=4", log=tmp_path / "sim.log") as sim:
        config = write_config(tmp_path / "kvwatch.yaml", db_url, sim)
        proc = start_kvwatch("run", "--config", str(config), log=log)
        running = wait_for(
            "a running probe row",
            lambda: rows(observed, ProbeState.RUNNING),
            timeout=60,
        )
        stop(proc, signal.SIGKILL)
        killed_id = running[0].id
        row = get_probe(observed, killed_id)
        assert row is not None and row.state is ProbeState.RUNNING, log.read_text()

        proc = start_kvwatch("run", "--config", str(config), log=log)
        try:
            wait_for(
                "the killed row to be marked interrupted",
                lambda: get_probe(observed, killed_id).state is ProbeState.INTERRUPTED,  # type: ignore[union-attr]
                timeout=60,
            )
            done = wait_for(
                "a new completed probe",
                lambda: rows(observed, ProbeState.DONE),
                timeout=60,
            )
            assert done[0].id > killed_id
            assert done[0].verdict == "pass"
        finally:
            assert stop(proc) == 0, log.read_text()


def test_sigterm_lets_an_in_flight_probe_finish(tmp_path, db_url, observed):
    """Graceful shutdown: a probe in flight completes and is stored before the exit."""
    log = tmp_path / "run.log"
    with simulator_process("name=slow,window=4096,ttfb_delay=3", log=tmp_path / "sim.log") as sim:
        config = write_config(tmp_path / "kvwatch.yaml", db_url, sim)
        proc = start_kvwatch("run", "--config", str(config), "--grace", "20", log=log)
        running = wait_for(
            "a running probe", lambda: rows(observed, ProbeState.RUNNING), timeout=60
        )
        assert stop(proc) == 0, log.read_text()
        row = get_probe(observed, running[0].id)
        assert row is not None and row.state is ProbeState.DONE and row.verdict == "pass"


def test_sigterm_past_the_grace_period_marks_the_probe_interrupted(tmp_path, db_url, observed):
    """A probe that outlives the grace period is stored as interrupted, not lost."""
    log = tmp_path / "run.log"
    with simulator_process("name=slow,window=4096,ttfb_delay=30", log=tmp_path / "sim.log") as sim:
        config = write_config(tmp_path / "kvwatch.yaml", db_url, sim)
        proc = start_kvwatch("run", "--config", str(config), "--grace", "1", log=log)
        running = wait_for(
            "a running probe", lambda: rows(observed, ProbeState.RUNNING), timeout=60
        )
        assert stop(proc) == 0, log.read_text()
        row = get_probe(observed, running[0].id)
        assert row is not None and row.state is ProbeState.INTERRUPTED


def metric_lines(listen: str) -> list[str]:
    try:
        text = httpx.get(f"http://{listen}/metrics", timeout=2).text
    except httpx.HTTPError:
        return []
    return [line for line in text.splitlines() if not line.startswith("#")]


def test_sighup_applies_endpoint_changes_and_rejects_a_bad_config(tmp_path, db_url):
    """Reload: an added endpoint is probed, a removed one's series vanish; an invalid file is
    refused, the old config keeps running and the reload gauge says so."""
    log = tmp_path / "run.log"
    with simulator_process(
        "name=slow,window=4096", "name=fresh,window=4096", log=tmp_path / "sim.log"
    ) as sim:
        path = write_config(tmp_path / "kvwatch.yaml", db_url, sim)
        listen = yaml.safe_load(path.read_text())["listen"]
        proc = start_kvwatch("run", "--config", str(path), log=log)
        try:
            wait_for(
                "the first config's metrics",
                lambda: any('endpoint="slow"' in m for m in metric_lines(listen)),
                timeout=60,
            )
            doc = yaml.safe_load(path.read_text())
            doc["endpoints"][0] = {**doc["endpoints"][0], "name": "fresh", "url": f"{sim}/fresh/v1"}
            path.write_text(yaml.safe_dump(doc))
            proc.send_signal(signal.SIGHUP)
            wait_for(
                "the new endpoint to be probed",
                lambda: any(
                    m.startswith('kvwatch_probes_total{endpoint="fresh"')
                    for m in metric_lines(listen)
                ),
                timeout=60,
            )
            lines = metric_lines(listen)
            assert not any('kvwatch_endpoint_info{endpoint="slow"' in m for m in lines)
            assert "kvwatch_config_last_reload_successful 1.0" in lines

            path.write_text(path.read_text().replace("context_window: 4096", "context_window: -1"))
            proc.send_signal(signal.SIGHUP)
            wait_for(
                "the failed reload gauge",
                lambda: "kvwatch_config_last_reload_successful 0.0" in metric_lines(listen),
                timeout=30,
            )
            assert "endpoints[0].context_window: must be a positive integer" in log.read_text()
            assert proc.poll() is None
            refused = httpx.post(f"http://{listen}/-/reload", timeout=10)
            assert refused.status_code == 500
            assert "endpoints[0].context_window: must be a positive integer" in refused.text
        finally:
            assert stop(proc) == 0, log.read_text()


def test_a_second_daemon_on_the_same_sqlite_file_refuses_to_start(tmp_path):
    """One kvwatch per SQLite file: the second exits 1 naming the problem and the fix."""
    db = f"sqlite:///{tmp_path / 'kvwatch.db'}"
    log = tmp_path / "run.log"
    with simulator_process("name=slow,window=4096", log=tmp_path / "sim.log") as sim:
        first_cfg = write_config(tmp_path / "a.yaml", db, sim)
        second_cfg = write_config(tmp_path / "b.yaml", db, sim)
        first = start_kvwatch("run", "--config", str(first_cfg), log=log)
        try:
            wait_for("the first daemon's lock", lambda: (tmp_path / "kvwatch.db.lock").exists())
            result = subprocess.run(
                kvwatch_cmd("run", "--config", str(second_cfg)),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert result.returncode == 1
            assert "already using the SQLite database" in result.stderr
            assert "use PostgreSQL for several replicas" in result.stderr
            assert first.poll() is None
        finally:
            assert stop(first) == 0, log.read_text()
