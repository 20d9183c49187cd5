"""Endpoints whose tokens kvwatch can only estimate (``tokenizer: usage``) are judged as such.

The simulated engines count with vocabularies that differ from anything kvwatch can know:
a few percent more tokens, a few percent fewer, and one whose count drifts while it runs.
They are healthy (they accept exactly the prompts their window admits and answer every one
correctly), so nothing may page; the same engine with a real limit fault still must. Real
HTTP to the simulator, the real store (SQLite and PostgreSQL) and the real alert evaluator.
"""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator, Sequence

import httpx
import pytest

from kvwatch.alerting.evaluator import AlertEvaluator
from kvwatch.alerting.policy import default_policy
from kvwatch.canary.model import SEVERITY, ProbeKind, Severity, Verdict
from kvwatch.probe.model import ProbeReport, Target
from kvwatch.probe.runner import ProbeRunner
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from kvwatch.store.repository import Store
from kvwatch.tokens.estimate import EstimatingCounter
from tests.helpers.targets import config_for, sim_endpoint_entry, targets_and_runner

WINDOW = 2048
KINDS = (ProbeKind.BASELINE, ProbeKind.UNDER, ProbeKind.OVER)
CYCLES = 1000
# Cycles each engine needs before its over probes must reach the limit.
WARM_UP = 3

HEALTHY = [
    SimEndpoint("wider", window=WINDOW, token_skew=0.04),
    SimEndpoint("narrower", window=WINDOW, token_skew=-0.04),
    # From 4 % more to about 4 % fewer over the run (about 3.5 requests a cycle).
    SimEndpoint("drifting", window=WINDOW, token_skew=0.04, token_skew_drift=-0.07),
]


def _entries(sim: object, endpoints: Sequence[SimEndpoint]) -> list[dict[str, object]]:
    return [
        sim_endpoint_entry(sim, ep.name, tokenizer="usage", baseline_tokens=512) for ep in endpoints
    ]


def _evaluator(store: Store) -> AlertEvaluator:
    return AlertEvaluator(
        policy=default_policy(),
        states=store.load_alert_states(),
        probe_url=lambda probe_id: f"http://kvwatch.test/probes/{probe_id}",
    )


async def _cycle(runner: ProbeRunner, target: Target) -> list[list[ProbeReport]]:
    return [await runner.run_checked(target, kind) for kind in KINDS]


@pytest.fixture
async def healthy(store: Store) -> AsyncIterator[tuple[dict[str, Target], ProbeRunner]]:
    async with run_simulator(HEALTHY) as sim, httpx.AsyncClient(timeout=60) as client:
        config = config_for(_entries(sim, HEALTHY), database="sqlite:///unused.db")
        targets, runner, _metrics = targets_and_runner(config, store, client)
        runner.alert_hook = _evaluator(store)
        yield targets, runner


async def test_engines_that_count_differently_never_page_in_a_thousand_cycles(
    healthy: tuple[dict[str, Target], ProbeRunner], store: Store
) -> None:
    """Healthy engines off kvwatch's estimate either way, or drifting: 0 critical verdicts,
    0 firing alerts, and after warm-up the over probe is refused in at least 95 % of cycles."""
    targets, runner = healthy
    evaluator = runner.alert_hook
    assert isinstance(evaluator, AlertEvaluator)
    verdicts: collections.Counter[tuple[str, str, str]] = collections.Counter()
    critical: list[str] = []
    refused = counted = 0
    names = [ep.name for ep in HEALTHY]
    for cycle in range(CYCLES):
        name = names[cycle % len(names)]
        for reports in await _cycle(runner, targets[name]):
            for report in reports:
                verdicts[(name, report.kind.value, report.verdict.value)] += 1
                if SEVERITY[report.verdict] is Severity.CRITICAL:
                    critical.append(f"{name} {report.kind} {report.verdict}: {report.reason}")
            last = reports[-1]
            if last.kind is ProbeKind.OVER and cycle >= WARM_UP * len(names):
                counted += 1
                refused += last.verdict is Verdict.PASS
    assert critical == []
    assert evaluator.firing() == []
    assert refused >= 0.95 * counted, f"over refused in {refused} of {counted} cycles"
    stored = {(r.endpoint, r.token_source) for r in store.calibrations()}
    assert stored == {(name, "usage") for name in names}
    # Every probe ended healthy or as a re-planned sizing miss: nothing else was drawn.
    assert {v for (_, _, v) in verdicts} <= {"pass", "sizing_miss"}, verdicts


async def test_a_real_limit_fault_still_pages_on_an_estimated_endpoint(store: Store) -> None:
    """The same skewed engine accepting over-limit prompts fires KVWatchLimitNotEnforced."""
    faulty = [
        SimEndpoint("loose", window=WINDOW, token_skew=0.04, fault=FaultMode.ACCEPT_OVER_LIMIT)
    ]
    async with run_simulator(faulty) as sim, httpx.AsyncClient(timeout=60) as client:
        config = config_for(_entries(sim, faulty), database="sqlite:///unused.db")
        targets, runner, _metrics = targets_and_runner(config, store, client)
        evaluator = _evaluator(store)
        runner.alert_hook = evaluator
        reports = await runner.run_checked(targets["loose"], ProbeKind.OVER)
    assert [r.verdict for r in reports] == [Verdict.OVER_ACCEPTED, Verdict.OVER_ACCEPTED]
    assert "the engine counted" in reports[0].reason
    assert [k.alertname for k in evaluator.firing()] == ["KVWatchLimitNotEnforced"]


async def test_a_restart_plans_from_the_stored_calibration(store: Store) -> None:
    """A new process on the same database starts from what the last one learnt: its first
    under probe needs no calibration request and lands as close to the limit as the last."""
    endpoints = [SimEndpoint("gw", window=WINDOW, token_skew=-0.04)]
    async with run_simulator(endpoints) as sim, httpx.AsyncClient(timeout=60) as client:
        config = config_for(_entries(sim, endpoints), database="sqlite:///unused.db")
        targets, runner, _metrics = targets_and_runner(config, store, client)
        for _ in range(4):
            await _cycle(runner, targets["gw"])
        learnt = targets["gw"].counter
        assert isinstance(learnt, EstimatingCounter) and learnt.calibrations.calibrated

        requests_before = sim.simulation["gw"].stats.requests
        targets, runner, _metrics = targets_and_runner(config, store, client)
        fresh = targets["gw"].counter
        assert isinstance(fresh, EstimatingCounter) and not fresh.calibrations.calibrated
        [under] = await runner.run_checked(targets["gw"], ProbeKind.UNDER)
        # The stored reports, and the one this probe added.
        before = learnt.calibrations.at(WINDOW).observations
        assert fresh.calibrations.at(WINDOW).observations == before + 1
        # One request: the probe itself, no calibration request before it.
        assert sim.simulation["gw"].stats.requests == requests_before + 1
    assert under.verdict is Verdict.PASS
    assert under.reported_prompt_tokens is not None
    # Within the learnt margin (at least 2·sqrt(2048) = 91 tokens here), not the wide one an
    # uncalibrated start keeps (60 % of the window).
    limit = WINDOW - 32
    assert limit - under.reported_prompt_tokens <= 0.10 * limit
