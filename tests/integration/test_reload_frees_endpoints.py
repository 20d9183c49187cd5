"""A real daemon reloaded to fewer endpoints: what it kept for the removed ones is gone."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import yaml

from kvwatch.canary.model import ProbeState
from kvwatch.store.engine import create_engine_for
from kvwatch.store.errors import StoreError
from kvwatch.store.repository import Store
from tests.helpers.processes import free_port, simulator_process, start_kvwatch, stop, wait_for

NAMES = ("kept", "changed", "gone-1", "gone-2")


def endpoint(sim: str, name: str, interval: str = "3s") -> dict[str, object]:
    return {
        "name": name,
        "url": f"{sim}/{name}/v1",
        "model": "sim-1",
        "context_window": 4096,
        "probes": ["baseline"],
        "interval": interval,
        "jitter": "0s",
        "confirm": False,
    }


def metric_lines(listen: str) -> list[str]:
    try:
        text = httpx.get(f"http://{listen}/metrics", timeout=5).text
    except httpx.HTTPError:
        return []
    return [line for line in text.splitlines() if not line.startswith("#")]


def entries(lines: list[str]) -> dict[str, float]:
    """kvwatch_internal_entries by map."""
    found = {}
    for line in lines:
        if line.startswith("kvwatch_internal_entries{"):
            labels, value = line.rsplit(" ", 1)
            found[labels.split('"')[1]] = float(value)
    return found


def probed(listen: str, names: tuple[str, ...]) -> list[str] | None:
    lines = metric_lines(listen)
    done = all(any(f'kvwatch_probes_total{{endpoint="{n}"' in m for m in lines) for n in names)
    return lines if done else None


def running_on(store: Store, endpoint: str) -> bool:
    try:
        return bool(store.list_probes(endpoint=endpoint, state=ProbeState.RUNNING))
    except StoreError:  # the daemon has not created the schema yet
        return False


def test_a_reload_removing_endpoints_leaves_no_series_and_shrinks_the_internal_maps(
    tmp_path: Path, db_url: str
) -> None:
    """Two of four endpoints removed (one of them mid-probe), one changed (same model):
    /metrics has no series naming the removed ones, not even after the probe in flight ends,
    the changed one keeps kvwatch_endpoint_info with its new interval, and every
    per-endpoint map holds the two left (metric children fewer than before), and so does the
    web layer's endpoint list, while a removed one's page stays."""
    log = tmp_path / "run.log"
    # gone-1 answers after 4 s: the reload comes while one of its probes runs.
    sims = [f"name={n},window=4096" + (",ttfb_delay=4" if n == "gone-1" else "") for n in NAMES]
    engine = create_engine_for(db_url)
    store = Store(engine)
    with simulator_process(*sims, log=tmp_path / "sim.log") as sim:
        listen = f"127.0.0.1:{free_port()}"
        doc = {
            "database": db_url,
            "listen": listen,
            "replica": "reload-frees",
            "endpoints": [endpoint(sim, n) for n in NAMES],
        }
        path = tmp_path / "kvwatch.yaml"
        path.write_text(yaml.safe_dump(doc))
        proc = start_kvwatch("run", "--config", str(path), log=log)
        try:
            before = entries(wait_for("every endpoint probed", lambda: probed(listen, NAMES), 90))
            assert before["targets"] == 4 and before["metric_series_cache"] == 4, before

            doc["endpoints"] = [endpoint(sim, "kept"), endpoint(sim, "changed", "4s")]
            path.write_text(yaml.safe_dump(doc))
            wait_for("a gone-1 probe in flight", lambda: running_on(store, "gone-1"), 30)
            proc.send_signal(signal.SIGHUP)
            lines = wait_for(
                "the reload to drop the removed endpoints",
                lambda: (m := metric_lines(listen)) and entries(m).get("targets") == 2 and m,
                timeout=60,
            )
            # The probe in flight at the reload finishes (its result brings series back for
            # a moment); once it has, none may be left.
            wait_for("the gone-1 probe to end", lambda: not running_on(store, "gone-1"), 30)
            lines = wait_for(
                "no series of the removed endpoints",
                lambda: (
                    (m := metric_lines(listen))
                    and not [x for x in m if 'endpoint="gone-' in x]
                    and probed(listen, ("kept", "changed"))
                ),
                timeout=30,
            )
            info = 'kvwatch_endpoint_info{endpoint="changed",flavour="openai",model="sim-1"} 1.0'
            assert info in lines
            interval = 'kvwatch_probe_interval_seconds{endpoint="changed",probe="baseline"} 4.0'
            assert interval in lines
            after = entries(lines)
            for name in ("targets", "scheduler_targets", "scheduler_jobs", "http_clients"):
                assert after[name] == 2, (name, after)
            for name in ("metric_series_cache", "metric_token_cache", "scheduler_due"):
                assert after[name] <= 2, (name, after)
            assert after["metric_children"] < before["metric_children"]
            # One model before and after: its filler counts are kept, not made again.
            assert before["piece_caches"] == after["piece_caches"] == 1, (before, after)
            listed = httpx.get(f"http://{listen}/api/v1/endpoints", timeout=10).json()
            assert sorted(e["name"] for e in listed) == ["changed", "kept"], listed
            assert httpx.get(f"http://{listen}/endpoints/gone-2", timeout=10).status_code == 200
        finally:
            assert stop(proc) == 0, log.read_text()
            engine.dispose()
