"""Detection latency: fault switched on → page visible in a real Alertmanager.

The daemon's own wiring (scheduler, runner, alert evaluator, delivery) probes a simulated
endpoint every INTERVAL seconds. Each trial switches the endpoint to ``stale_kv`` at a random
phase of the schedule and times how long until ``GET /api/v2/alerts`` on a real Alertmanager
shows KVWatchCrossRequestLeak or KVWatchContextNotHonored; then switches the fault off and
waits for the resolution before the next trial. Goal (issue 3): ≤ interval + probe time + 15 s.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import structlog

from bench.machine import describe
from kvwatch.daemon import build
from kvwatch.scheduler import ProbeScheduler
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from tests.helpers.alertmanager import AlertmanagerProcess, RecordingServer
from tests.helpers.targets import config_for, sim_endpoint_entry

INTERVAL = 5.0
TRIALS = 20
PAGES = {"KVWatchCrossRequestLeak", "KVWatchContextNotHonored"}


def paged(am_url: str) -> bool:
    alerts = httpx.get(f"{am_url}/api/v2/alerts", timeout=5).json()
    return any(
        a["labels"].get("alertname") in PAGES and a["status"]["state"] == "active" for a in alerts
    )


async def wait(predicate, timeout: float) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if await asyncio.to_thread(predicate):
            return time.perf_counter() - start
        await asyncio.sleep(0.1)
    raise TimeoutError(f"not seen within {timeout} s")


async def run(trials: int) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    print(f"# detection latency — {describe()}")
    print(f"# interval {INTERVAL:.0f} s, {trials} trials, real Alertmanager, stale_kv fault")
    tmp = Path(tempfile.mkdtemp(prefix="kvwatch-bench-"))
    with RecordingServer() as webhook:
        am = AlertmanagerProcess(webhook.url)
        am.start()
        try:
            async with run_simulator([SimEndpoint("ep", window=8192, kv_pool=6144)]) as sim:
                entry = sim_endpoint_entry(
                    sim, "ep", interval=f"{INTERVAL:.0f}s", probes=["under", "baseline"]
                )
                config = config_for(
                    [entry],
                    database=f"sqlite:///{tmp / 'kvwatch.db'}",
                    alertmanager={"urls": [am.url], "resend_interval": "5s"},
                )
                built = await build(config)
                assert built.delivery is not None
                delivery = asyncio.create_task(built.delivery.run())
                scheduler = ProbeScheduler(built.runner, first_run_within=1.0)
                scheduler.start(built.targets)
                latencies, durations = [], []
                try:
                    for i in range(trials):
                        await asyncio.sleep(random.uniform(0, INTERVAL))
                        sim.set_fault("ep", FaultMode.STALE_KV)
                        latency = await wait(lambda: paged(am.url), 120)
                        latencies.append(latency)
                        sim.set_fault("ep", FaultMode.HEALTHY)
                        await wait(lambda: not paged(am.url), 180)
                        print(f"trial {i + 1:>2}: {latency:5.2f} s", file=sys.stderr)
                    for row in built.store.list_probes(kind="under", limit=1000):
                        if row.duration_seconds is not None:
                            durations.append(row.duration_seconds)
                finally:
                    await scheduler.shutdown(5)
                    delivery.cancel()
                    await asyncio.gather(delivery, return_exceptions=True)
                    await built.delivery.aclose()
                    await built.clients.aclose()
        finally:
            am.close()
    probe_time = statistics.median(durations) if durations else 0.0
    goal = INTERVAL + probe_time + 15
    print(f"median {statistics.median(latencies):.2f} s, max {max(latencies):.2f} s")
    print(f"goal ≤ interval + probe time + 15 s = {goal:.2f} s")
    print(f"(median under probe {probe_time:.3f} s)")
    print("met" if max(latencies) <= goal else "NOT met")


def main() -> None:
    asyncio.run(run(TRIALS))
