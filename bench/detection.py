"""Detection latency: fault switched on → page visible in a real Alertmanager.

The daemon's own wiring (scheduler, runner, alert evaluator, delivery) probes a simulated
endpoint every INTERVAL seconds. Each trial switches the endpoint to the fault at a random
phase of the schedule and times how long until ``GET /api/v2/alerts`` on a real Alertmanager
shows one of the fault's pages; then switches the fault off and waits for the resolution
before the next trial. Goal (issue 3): ≤ interval + probe time + 15 s for ``stale_kv``.

``batch_mix`` (issue 20) is caught by the burst probe, whose size takes the next of
``burst.sizes`` each cycle: with the default sizes (3, 7, 9, 17) and the fault's default
threshold of 8 requests in flight, only every other cycle can see it, and a leak is confirmed
by a second burst of the same size before it pages. Its report adds what a burst cycle costs:
prompt and completion tokens per cycle, from the stored probes.

``prefix_collision`` and ``abort_reuse`` (issue 20) are caught by the cache probe (the default
3,000-token document): a wrong answer served from the prefix cache, confirmed by a second
cycle, pages ``KVWatchCacheCorrupt``. Their report adds the prompt tokens of a cycle the
engine said it served from its cache. ``python -m bench.detection FAULT ...`` runs only those
fault modes.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import structlog

from bench.machine import describe
from kvwatch.daemon import build
from kvwatch.scheduler import ProbeScheduler
from kvwatch.simulator.server import RunningSimulator, run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from kvwatch.store.records import ProbeRow
from tests.helpers.alertmanager import AlertmanagerProcess, RecordingServer
from tests.helpers.targets import config_for, sim_endpoint_entry

INTERVAL = 5.0


@dataclass(frozen=True, slots=True)
class Case:
    """One fault mode: the endpoint it runs on, the probes that catch it, what pages."""

    fault: FaultMode
    endpoint: SimEndpoint
    probes: tuple[str, ...]
    kind: str  # the probe kind whose stored rows give the probe time and its tokens
    pages: frozenset[str]
    trials: int
    settings: tuple[tuple[str, object], ...] = ()  # more keys of the endpoint's config entry


CASES = (
    Case(
        FaultMode.STALE_KV,
        SimEndpoint("ep", window=8192, kv_pool=6144),
        ("under", "baseline"),
        "under",
        frozenset({"KVWatchCrossRequestLeak", "KVWatchContextNotHonored"}),
        20,
    ),
    Case(
        FaultMode.BATCH_MIX,
        SimEndpoint("ep", window=4096),
        ("burst",),
        "burst",
        frozenset({"KVWatchCrossRequestLeak", "KVWatchBurstWrong"}),
        8,
    ),
    Case(
        FaultMode.PREFIX_COLLISION,
        SimEndpoint("ep", window=4096),
        ("cache",),
        "cache",
        frozenset({"KVWatchCacheCorrupt"}),
        6,
    ),
    Case(
        FaultMode.ABORT_REUSE,
        SimEndpoint("ep", window=4096),
        ("cache",),
        "cache",
        frozenset({"KVWatchCacheCorrupt"}),
        6,
    ),
)


def paged(am_url: str, pages: frozenset[str]) -> bool:
    alerts = httpx.get(f"{am_url}/api/v2/alerts", timeout=5).json()
    return any(
        a["labels"].get("alertname") in pages and a["status"]["state"] == "active" for a in alerts
    )


async def wait(predicate, timeout: float) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if await asyncio.to_thread(predicate):
            return time.perf_counter() - start
        await asyncio.sleep(0.1)
    raise TimeoutError(f"not seen within {timeout} s")


async def trials(case: Case, sim: RunningSimulator, am_url: str) -> list[float | None]:
    """Each trial's time to the page (None: not paged within the limit)."""
    latencies: list[float | None] = []
    for i in range(case.trials):
        await asyncio.sleep(random.uniform(0, INTERVAL))
        sim.simulation.set_fault("ep", case.fault)
        try:
            latency: float | None = await wait(lambda: paged(am_url, case.pages), 120)
        except TimeoutError:
            latency = None
        latencies.append(latency)
        sim.simulation.set_fault("ep", FaultMode.HEALTHY)
        await wait(lambda: not paged(am_url, case.pages), 180)
        shown = "not paged" if latency is None else f"{latency:5.2f} s"
        print(f"{case.fault.value} trial {i + 1:>2}: {shown}", file=sys.stderr)
    return latencies


async def run_case(case: Case, tmp: Path, am_url: str) -> tuple[list[float | None], list[ProbeRow]]:
    async with run_simulator([case.endpoint]) as sim:
        entry = sim_endpoint_entry(
            sim, "ep", interval=f"{INTERVAL:.0f}s", probes=list(case.probes), **dict(case.settings)
        )
        config = config_for(
            [entry],
            database=f"sqlite:///{tmp / f'{case.fault.value}.db'}",
            alertmanager={"urls": [am_url], "resend_interval": "5s"},
        )
        built = await build(config)
        assert built.delivery is not None
        delivery = asyncio.create_task(built.delivery.run())
        scheduler = ProbeScheduler(built.runner, first_run_within=1.0)
        scheduler.start(built.targets)
        try:
            latencies = await trials(case, sim, am_url)
            rows = built.store.list_probes(kind=case.kind, limit=1000)
        finally:
            await scheduler.shutdown(5)
            delivery.cancel()
            await asyncio.gather(delivery, return_exceptions=True)
            await built.delivery.aclose()
            await built.clients.aclose()
    return latencies, rows


def report(case: Case, latencies: Sequence[float | None], rows: Sequence[ProbeRow]) -> None:
    seen = [x for x in latencies if x is not None]
    verdicts = sorted({r.verdict for r in rows if r.verdict not in (None, "pass")})
    durations = [r.duration_seconds for r in rows if r.duration_seconds is not None]
    probe_time = statistics.median(durations) if durations else 0.0
    print(f"## {case.fault.value} ({', '.join(case.probes)} every {INTERVAL:.0f} s)")
    print(f"detected: {'yes' if seen else 'no'} in {len(seen)} of {len(latencies)} trials")
    print(f"verdicts: {', '.join(verdicts) or 'none'}")
    if seen:
        print(f"time to page: median {statistics.median(seen):.2f} s, max {max(seen):.2f} s")
    print(f"median {case.kind} probe {probe_time:.3f} s")
    prompt = [r.reported_prompt_tokens for r in rows if r.reported_prompt_tokens is not None]
    completion = [r.completion_tokens for r in rows if r.completion_tokens is not None]
    cached = [r.cached_prompt_tokens for r in rows if r.cached_prompt_tokens is not None]
    if prompt and completion:
        of_which = f"median {statistics.median(cached):.0f}" if cached else "not reported"
        print(
            f"tokens per {case.kind} probe: prompt median {statistics.median(prompt):.0f} "
            f"(of which cached: {of_which}), completion median "
            f"{statistics.median(completion):.0f}"
        )
    if case.fault is FaultMode.STALE_KV and seen:
        goal = INTERVAL + probe_time + 15
        print(f"goal ≤ interval + probe time + 15 s = {goal:.2f} s")
        print("met" if len(seen) == len(latencies) and max(seen) <= goal else "NOT met")


async def run(cases: Sequence[Case] = CASES) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    print(f"# detection latency — {describe()}")
    print(f"# interval {INTERVAL:.0f} s, real Alertmanager")
    tmp = Path(tempfile.mkdtemp(prefix="kvwatch-bench-"))
    with RecordingServer() as webhook:
        am = AlertmanagerProcess(webhook.url)
        am.start()
        try:
            for case in cases:
                latencies, rows = await run_case(case, tmp, am.url)
                report(case, latencies, rows)
        finally:
            am.close()


def main(faults: Sequence[str] = ()) -> None:
    wanted = set(faults)
    known = {c.fault.value for c in CASES}
    if wanted - known:
        raise SystemExit(f"unknown fault modes {sorted(wanted - known)}; known: {sorted(known)}")
    asyncio.run(run([c for c in CASES if not wanted or c.fault.value in wanted]))


if __name__ == "__main__":
    main(sys.argv[1:])
