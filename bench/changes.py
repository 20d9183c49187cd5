"""Change-triggered canaries vs a fixed schedule, over a simulated day of redeploys.

Two parts, one run:

1. **Measured** (real daemon wiring, simulator, real Alertmanager): REAL_ENDPOINTS simulated
   vLLM endpoints with the default one-minute capacity check and a 1 h schedule are each
   redeployed once, at a random moment, with a fault that arrives with the redeploy
   (``PUT /NAME/_sim/fingerprint`` with ``fault``). Timed: redeploy → page visible in
   Alertmanager, and its part after the change was seen (change → page: the canaries,
   their confirmation, the alert's delivery).
2. **Simulated day** (time-compressed, kvwatch's own pure logic: kvwatch.phase for every
   slot, kvwatch.fingerprint.run_after for the minimum gap, kvwatch.canary.spend for tokens
   and the budget): DAY_ENDPOINTS endpoints redeployed at random times over a day, a share of
   the redeploys faulty, and faults that arrive without any redeploy. A fault is paged when
   the first run able to see it starts, plus a change → page latency drawn from part 1.
   Schedules: fixed 15 min, and change-triggered + 1 h (a change run replaces the kind's
   next free scheduled run, as kvwatch.changes does).

Then the spread schedule's start rate: 3,000 jobs every 15 min, before (every job at the
interval's start plus up to 30 s of jitter) and after (each at its hashed phase).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import structlog

from bench.machine import describe
from kvwatch.canary.model import ProbeKind
from kvwatch.canary.spend import DAY, RunShape, fit_budget, run_tokens
from kvwatch.changes import ChangeWatcher
from kvwatch.config.resolve import (
    CAPACITY_INTERVAL_SECONDS,
    CAPACITY_JITTER_SECONDS,
    default_jitter,
)
from kvwatch.daemon import build
from kvwatch.fingerprint import run_after
from kvwatch.phase import next_slot_start, phase_ms, slot_for
from kvwatch.scheduler import ProbeScheduler
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import FaultMode, Flavour, SimEndpoint
from tests.helpers.alertmanager import AlertmanagerProcess, RecordingServer
from tests.helpers.targets import config_for, sim_endpoint_entry

REAL_ENDPOINTS = 8
# Redeploys fall in this window after the start: every endpoint's first fingerprint is taken
# by then, and each redeploy lands at a random phase of its capacity check.
REDEPLOY_FROM, REDEPLOY_TO = 20.0, 80.0
PAGE = "KVWatchLimitNotEnforced"  # the page of the fault the redeploys bring (accept_over_limit)

DAY_ENDPOINTS = 1000
REDEPLOYS_PER_DAY = 3.0  # per endpoint, Poisson
FAULTY_SHARE = 0.2  # of redeploys, the fault arriving with the change
SILENT_FAULTS_PER_DAY = 0.3  # per endpoint: faults that arrive with no fingerprint change
KINDS = (ProbeKind.UNDER, ProbeKind.OVER, ProbeKind.BASELINE)
KIND_NAMES = [k.value for k in KINDS]
CATCHER = ProbeKind.OVER  # the kind whose run sees the simulated fault
GAP = 600.0  # on_change_min_gap's default
SHAPE = RunShape(
    flavour="vllm",
    window=1_048_576,
    max_tokens=32,
    baseline_tokens=1536,
    burst_sizes=(3,),
    burst_prompt_tokens=512,
)


# -- part 1: measured on a real run ----------------------------------------------------------


def paged_endpoints(am_url: str) -> set[str]:
    alerts = httpx.get(f"{am_url}/api/v2/alerts", timeout=5).json()
    return {
        a["labels"]["endpoint"]
        for a in alerts
        if a["labels"].get("alertname") == PAGE and a["status"]["state"] == "active"
    }


async def measured(tmp: Path, am_url: str) -> tuple[list[float], list[float]]:
    """(redeploy → page, change seen → page) of each endpoint, in seconds."""
    names = [f"ep{i}" for i in range(REAL_ENDPOINTS)]
    sims = [SimEndpoint(n, window=8192, flavour=Flavour.VLLM) for n in names]
    async with run_simulator(sims) as sim, httpx.AsyncClient() as client:
        entries = [
            sim_endpoint_entry(
                sim, n, flavour="vllm", interval="1h", probes=["capacity", *KIND_NAMES]
            )
            for n in names
        ]
        for entry in entries:
            del entry["jitter"]  # the defaults' jitters, as deployed
        config = config_for(
            entries,
            database=f"sqlite:///{tmp / 'changes.db'}",
            alertmanager={"urls": [am_url], "resend_interval": "5s"},
        )
        built = await build(config)
        assert built.delivery is not None
        delivery = asyncio.create_task(built.delivery.run())
        watcher = ChangeWatcher(built.store, built.metrics, replica=config.replica_id)
        scheduler = ProbeScheduler(built.runner, first_run_within=5.0, watcher=watcher)
        scheduler.start(built.targets)
        polling = asyncio.create_task(scheduler.watch_changes())
        start = time.time()
        try:
            deploys = {n: start + random.uniform(REDEPLOY_FROM, REDEPLOY_TO) for n in names}
            pages: dict[str, float] = {}
            pending = dict(sorted(deploys.items(), key=lambda kv: kv[1]))
            while len(pages) < len(names) and time.time() < start + REDEPLOY_TO + 300:
                now = time.time()
                for n, at in list(pending.items()):
                    if now >= at:
                        response = await client.put(
                            f"{sim.base_url}/{n}/_sim/fingerprint",
                            json={"version": "0.12.0", "fault": FaultMode.ACCEPT_OVER_LIMIT.value},
                        )
                        response.raise_for_status()
                        deploys[n] = time.time()
                        del pending[n]
                for n in await asyncio.to_thread(paged_endpoints, am_url):
                    pages.setdefault(n, time.time())
                await asyncio.sleep(0.1)
            seen = {c.endpoint: c.at.timestamp() for c in built.store.list_changes(limit=500)}
        finally:
            polling.cancel()
            await scheduler.shutdown(5)
            delivery.cancel()
            await asyncio.gather(delivery, polling, return_exceptions=True)
            await built.delivery.aclose()
            await built.clients.aclose()
    missed = sorted(set(names) - set(pages))
    if missed:
        print(f"not paged within the limit: {', '.join(missed)}", file=sys.stderr)
    to_page = [pages[n] - deploys[n] for n in names if n in pages]
    after_change = [pages[n] - seen[n] for n in names if n in pages and n in seen]
    return to_page, after_change


# -- part 2: a simulated day -----------------------------------------------------------------


@dataclass
class Endpoint:
    name: str
    redeploys: list[tuple[float, bool]]  # (time, brings a fault)
    silent_faults: list[float]
    skipped: set[int] = field(default_factory=set)  # CATCHER slots a change run replaced
    last_change_run: float | None = None


def day_of_endpoints(rng: random.Random) -> list[Endpoint]:
    endpoints = []
    for i in range(DAY_ENDPOINTS):
        redeploys, t = [], rng.expovariate(REDEPLOYS_PER_DAY / DAY)
        while t < DAY:
            redeploys.append((t, rng.random() < FAULTY_SHARE))
            t += rng.expovariate(REDEPLOYS_PER_DAY / DAY)
        silent, t = [], rng.expovariate(SILENT_FAULTS_PER_DAY / DAY)
        while t < DAY:
            silent.append(t)
            t += rng.expovariate(SILENT_FAULTS_PER_DAY / DAY)
        endpoints.append(Endpoint(f"endpoint-{i:04d}", redeploys, silent))
    return endpoints


def next_run(ep: Endpoint, kind: ProbeKind, t: float, interval: float, rng: random.Random) -> float:
    """When the next scheduled run of ``kind`` at or after ``t`` starts (its phase, then the
    default jitter), skipping slots a change run replaced."""
    phase = phase_ms(ep.name, kind.value, interval)
    due = next_slot_start(t, interval, phase)
    while kind is CATCHER and slot_for(due, interval, phase) in ep.skipped:
        due += interval
    return due + rng.uniform(0, default_jitter(interval))


@dataclass
class Outcome:
    faulty_redeploy_to_page: list[float] = field(default_factory=list)
    silent_fault_to_page: list[float] = field(default_factory=list)
    tokens: float = 0.0
    change_runs: int = 0
    held: int = 0


def simulate(
    endpoints: list[Endpoint], interval: float, on_change: bool, latency: list[float], seed: int
) -> Outcome:
    rng = random.Random(seed)
    out = Outcome()
    per_run = sum(run_tokens(k, SHAPE).spent or 0.0 for k in KINDS)
    for ep in endpoints:
        ep.skipped, ep.last_change_run = set(), None
        runs = DAY / interval  # scheduled runs of each kind in the day
        extra = 0
        if on_change:
            extra, held = change_runs(ep, interval, rng, out, latency)
            out.held += held
        for t, faulty in ep.redeploys:
            if faulty and not on_change:
                page = next_run(ep, CATCHER, t, interval, rng) + rng.choice(latency)
                out.faulty_redeploy_to_page.append(page - t)
        for t in ep.silent_faults:
            page = next_run(ep, CATCHER, t, interval, rng) + rng.choice(latency)
            out.silent_fault_to_page.append(page - t)
        out.tokens += (runs + extra) * per_run
        out.change_runs += extra
    out.tokens /= len(endpoints)
    return out


def change_runs(
    ep: Endpoint, interval: float, rng: random.Random, out: Outcome, latency: list[float]
) -> tuple[int, int]:
    """Run ep's redeploys through the change path; (change runs beyond the schedule, held)."""
    cap_phase = phase_ms(ep.name, ProbeKind.CAPACITY.value, CAPACITY_INTERVAL_SECONDS)
    catcher_phase = phase_ms(ep.name, CATCHER.value, interval)
    extra = held = 0
    for t, faulty in ep.redeploys:
        # The next capacity check sees the new fingerprint (this replica's own run of it).
        seen = next_slot_start(t, CAPACITY_INTERVAL_SECONDS, cap_phase) + rng.uniform(
            0, CAPACITY_JITTER_SECONDS
        )
        last = None if ep.last_change_run is None else _at(ep.last_change_run)
        starts = run_after(_at(seen), last, GAP).timestamp()
        held += starts > seen + 0.001  # datetimes hold microseconds
        ep.last_change_run = starts
        # It replaces the catcher's first free scheduled slot among the next few.
        due = next_slot_start(starts, interval, catcher_phase)
        for _ in range(4):
            slot = slot_for(due, interval, catcher_phase)
            if slot not in ep.skipped:
                ep.skipped.add(slot)
                break
            due += interval
        else:
            extra += 1
        if faulty:
            out.faulty_redeploy_to_page.append(starts + rng.choice(latency) - t)
    return extra, held


def _at(t: float) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=t)


# -- part 3: the start rate of 3,000 jobs ---------------------------------------------------


def start_rates(jobs: int = 3000, interval: float = 900.0) -> tuple[Counter[int], Counter[int]]:
    """Starts per second over one interval: before (interval start + up to 30 s of jitter)
    and after (each job's hashed phase + the same jitter)."""
    rng = random.Random(11)
    jitter = default_jitter(interval)
    before = Counter(int(rng.uniform(0, jitter)) for _ in range(jobs))
    after = Counter(
        int(
            (phase_ms(f"endpoint-{i:04d}", "under", interval) / 1000 + rng.uniform(0, jitter))
            % interval
        )
        for i in range(jobs)
    )
    return before, after


# -- report ----------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def fmt(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


async def run() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    print(f"# change-triggered canaries — {describe()}")
    tmp = Path(tempfile.mkdtemp(prefix="kvwatch-bench-changes-"))
    with RecordingServer() as webhook:
        am = AlertmanagerProcess(webhook.url)
        am.start()
        try:
            to_page, after_change = await measured(tmp, am.url)
        finally:
            am.close()
    print(
        f"\n## measured: {len(to_page)} of {REAL_ENDPOINTS} faulty redeploys paged "
        f"(capacity check every {CAPACITY_INTERVAL_SECONDS:.0f} s, real Alertmanager)"
    )
    print(
        f"redeploy → page: median {statistics.median(to_page):.1f} s, "
        f"p95 {pct(to_page, 0.95):.1f} s, max {max(to_page):.1f} s"
    )
    print(
        f"change seen → page (canaries, confirmation, delivery): median "
        f"{statistics.median(after_change):.1f} s, max {max(after_change):.1f} s"
    )
    rng = random.Random(7)
    endpoints = day_of_endpoints(rng)
    fixed = simulate(endpoints, 900.0, on_change=False, latency=after_change, seed=1)
    changed = simulate(endpoints, 3600.0, on_change=True, latency=after_change, seed=1)
    redeploys = sum(len(e.redeploys) for e in endpoints)
    faulty = sum(f for e in endpoints for _, f in e.redeploys)
    silent = sum(len(e.silent_faults) for e in endpoints)
    print(
        f"\n## simulated day: {DAY_ENDPOINTS} endpoints, {redeploys} redeploys ({faulty} "
        f"faulty), {silent} faults without a change; window {SHAPE.window:,}, "
        f"kinds {', '.join(k.value for k in KINDS)}"
    )
    print(
        "| schedule | faulty redeploy → page, median / p95 | fault without a change → "
        "page, median | tokens per endpoint-day |"
    )
    print("|---|---|---|---|")
    for label, o in (("fixed 15 min", fixed), ("change-triggered + 1 h", changed)):
        r, s = o.faulty_redeploy_to_page, o.silent_fault_to_page
        print(
            f"| {label} | {fmt(statistics.median(r))} / {fmt(pct(r, 0.95))} | "
            f"{fmt(statistics.median(s))} | {o.tokens:,.0f} |"
        )
    ratio = changed.tokens / fixed.tokens
    print(
        f"change runs: {changed.change_runs} beyond the schedule (the rest replaced a "
        f"scheduled run), {changed.held} held by the {GAP / 60:.0f} min gap"
    )
    p95 = pct(changed.faulty_redeploy_to_page, 0.95)
    goal_latency = CAPACITY_INTERVAL_SECONDS + statistics.median(after_change)
    print(
        f"goal: faulty redeploy pages within one capacity interval + the probe "
        f"(measured: median {fmt(statistics.median(to_page))}, p95 {fmt(pct(to_page, 0.95))}; "
        f"simulated p95 {fmt(p95)}, {fmt(goal_latency)} = 60 s + median change → page) and "
        f"≤ ¼ of the fixed schedule's tokens (ratio {ratio:.3f}): "
        f"{'met' if pct(to_page, 0.95) <= 60 + max(after_change) and ratio <= 0.25 else 'NOT met'}"
    )
    plan = fit_budget(
        {k: run_tokens(k, SHAPE).spent or 0.0 for k in KINDS},
        dict.fromkeys(KINDS, 900.0),
        frozenset(),
        int(fixed.tokens / 4),
    )
    paced = ", ".join(f"{k.value} {plan.intervals[k] / 60:.0f} min" for k in KINDS)
    print(f"a budget of ¼ of the fixed spend ({int(fixed.tokens / 4):,}/day) paces: {paced}")
    before, after = start_rates()
    print("\n## start rate, 3,000 jobs every 15 min")
    for label, counts in (
        ("before (interval start + jitter)", before),
        ("after (hashed phase)", after),
    ):
        busy = [counts.get(s, 0) for s in range(900)]
        active = sum(1 for n in busy if n)
        print(
            f"{label}: peak {max(busy)}/s, mean over busy seconds "
            f"{sum(busy) / max(active, 1):.1f}/s, busy {active} of 900 s"
        )


def main() -> None:
    asyncio.run(run())
