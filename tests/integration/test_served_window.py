"""The true served window end to end: simulator faults → bisect probes → stored window.

Real HTTP to kvwatch's simulator, the real engine adapter and token counter, the real store
(SQLite and PostgreSQL). Each fault keeps prompts whole only up to the endpoint's KV pool;
the search must find exactly that limit, spending what the engine's own signals allow.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.canary.planning import PlanningError, plan_prompt
from kvwatch.canary.served import probe_budget
from kvwatch.daemon import build
from kvwatch.demo import demo_config
from kvwatch.probe.model import ProbeReport, Target
from kvwatch.probe.runner import ProbeRunner
from kvwatch.simulator.fleet import demo_fleet
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from kvwatch.store.repository import Store
from kvwatch.web.app import WebContext, create_app
from tests.helpers.store import get_probe
from tests.helpers.targets import config_for, sim_endpoint_entry, targets_and_runner

UNDER, BASE, BISECT = ProbeKind.UNDER, ProbeKind.BASELINE, ProbeKind.BISECT
WINDOW, POOL, MAX_TOKENS = 16_384, 6_144, 32

FLEET = [
    SimEndpoint("head", window=WINDOW, kv_pool=POOL, fault=FaultMode.TRUNCATE_HEAD),
    SimEndpoint("tail", window=WINDOW, kv_pool=POOL, fault=FaultMode.TRUNCATE_TAIL),
    SimEndpoint("not-served", window=WINDOW, kv_pool=POOL, fault=FaultMode.WINDOW_NOT_SERVED),
    SimEndpoint("stale", window=WINDOW, kv_pool=POOL, fault=FaultMode.STALE_KV),
    SimEndpoint("stale-pool", window=WINDOW, kv_pool=POOL, fault=FaultMode.STALE_KV),
    SimEndpoint(
        "llama", window=WINDOW, kv_pool=POOL, fault=FaultMode.WINDOW_NOT_SERVED, flavour="llamacpp"
    ),
]


@pytest.fixture
async def rig(store: Store) -> AsyncIterator[tuple[Any, dict[str, Target], ProbeRunner]]:
    async with run_simulator(FLEET) as sim, httpx.AsyncClient(timeout=None) as client:
        entries = [sim_endpoint_entry(sim, ep.name) for ep in FLEET]
        for entry in entries:
            if entry["name"] == "stale-pool":
                entry["flavour"] = "vllm"  # reports its KV pool (/metrics)
            if entry["name"] == "llama":
                entry["flavour"] = "llamacpp"
        config = config_for(
            entries, database="sqlite:///unused.db", defaults={"max_tokens": MAX_TOKENS}
        )
        targets, runner, _metrics = targets_and_runner(config, store, client)
        yield sim, targets, runner


async def failing_under(runner: ProbeRunner, target: Target) -> list[ProbeReport]:
    """A passing baseline (the search's floor), then the under chain that fails."""
    assert (await runner.run(target, BASE)).verdict is Verdict.PASS
    return await runner.run_checked(target, UNDER)


@pytest.mark.parametrize("name", ["head", "tail"])
async def test_a_truncated_answer_names_the_served_window_and_two_probes_confirm_it(
    rig: tuple, store: Store, name: str
) -> None:
    """Truncation reports the KV pool as prompt tokens: probed whole, then one over."""
    _sim, targets, runner = rig
    reports = await failing_under(runner, targets[name])
    steps = [r for r in reports if r.kind is BISECT]
    trigger = reports[1]
    assert trigger.verdict is Verdict.TRUNCATED and trigger.confirms_probe_id is not None
    assert [(r.planned_prompt_tokens, r.verdict) for r in steps] == [
        (POOL, Verdict.PASS),
        (POOL + 1, Verdict.TRUNCATED),
    ]
    record = store.served_windows(name)[name]
    assert (record.served_tokens, record.exact, record.probes) == (POOL, True, 2)
    assert record.advertised_tokens == WINDOW and record.probe_id == trigger.probe_id
    for step in steps:
        assert step.probe_id is not None
        row = get_probe(store, step.probe_id)
        assert row is not None and row.kind == "bisect"
        assert row.trigger_probe_id == trigger.probe_id


async def test_a_rejection_that_names_the_pool_is_turned_into_the_largest_prompt(
    rig: tuple, store: Store
) -> None:
    """vLLM refuses prompt + max_tokens > pool and says so: pool − max_tokens, to the token."""
    _sim, targets, runner = rig
    reports = await failing_under(runner, targets["not-served"])
    assert reports[0].verdict is Verdict.UNDER_REJECTED
    steps = [r for r in reports if r.kind is BISECT]
    assert [r.planned_prompt_tokens for r in steps] == [POOL - MAX_TOKENS, POOL - MAX_TOKENS + 1]
    record = store.served_windows("not-served")["not-served"]
    assert (record.served_tokens, record.exact) == (POOL - MAX_TOKENS, True)


async def test_llama_cpp_n_ctx_in_the_rejection_gives_the_largest_prompt(
    rig: tuple, store: Store
) -> None:
    """llama.cpp refuses prompt >= n_ctx and reports n_ctx: the limit is n_ctx − 1."""
    _sim, targets, runner = rig
    await failing_under(runner, targets["llama"])
    record = store.served_windows("llama")["llama"]
    assert (record.served_tokens, record.exact, record.probes) == (POOL - 1, True, 2)


async def test_a_placeholder_swap_without_a_signal_is_bisected_within_the_budget(
    rig: tuple, store: Store
) -> None:
    """Stale KV reports one prompt token (a lie about the limit): bisection brackets it."""
    _sim, targets, runner = rig
    reports = await failing_under(runner, targets["stale"])
    steps = [r for r in reports if r.kind is BISECT]
    assert 0 < len(steps) <= probe_budget(WINDOW)
    record = store.served_windows("stale")["stale"]
    assert record.served_tokens <= POOL < (record.unserved_tokens or 0)
    assert (record.unserved_tokens or 0) - record.served_tokens <= 1024


async def test_a_placeholder_swap_before_any_baseline_passed_is_measured_with_no_error_step(
    rig: tuple, store: Store
) -> None:
    """The incident's own signature first (no baseline yet, usage 1): the 1 is no candidate,
    bisection brackets the pool with steps that can all be planned, and the window is stored."""
    _sim, targets, runner = rig
    reports = await runner.run_checked(targets["stale"], UNDER)
    assert [r.reported_prompt_tokens for r in reports if r.kind is UNDER] == [1, 1]
    steps = [r for r in reports if r.kind is BISECT]
    assert 0 < len(steps) <= probe_budget(WINDOW)
    assert Verdict.ERROR not in [r.verdict for r in steps]
    assert all(r.planned_prompt_tokens is not None for r in steps)
    record = store.served_windows("stale")["stale"]
    assert record.served_tokens <= POOL < (record.unserved_tokens or 0)
    assert (record.unserved_tokens or 0) - record.served_tokens <= 1024
    assert record.probes == len(steps)


async def test_a_placeholder_swap_before_any_baseline_passed_is_exact_at_the_reported_pool(
    rig: tuple, store: Store
) -> None:
    """With the engine's KV pool known (vLLM /metrics), the pool is the candidate the 1 is
    not: verified by two probes, to the token, with no error step."""
    _sim, targets, runner = rig
    target = targets["stale-pool"]
    target.state.discovery = await target.engine.discover()  # what the capacity check keeps
    reports = await runner.run_checked(target, UNDER)
    steps = [r for r in reports if r.kind is BISECT]
    assert [(r.planned_prompt_tokens, r.verdict is Verdict.PASS) for r in steps] == [
        (POOL, True),
        (POOL + 1, False),
    ]
    assert Verdict.ERROR not in [r.verdict for r in steps]
    record = store.served_windows("stale-pool")["stale-pool"]
    assert (record.served_tokens, record.exact) == (POOL, True)


async def test_a_step_kvwatch_cannot_plan_is_logged_with_its_size_and_the_search_goes_on(
    rig: tuple, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A template whose fixed text outgrows the planner's bound (a long default system
    prompt) refuses small steps: each is logged with the size asked for, the search goes on
    above it, ends within the budget and stores what it proved; the streak is not searched
    again."""
    fixed_text = 7_000

    async def template_with_a_long_system_prompt(kind: ProbeKind, **kw: Any) -> Any:
        if kind is BISECT and kw["target_tokens"] < fixed_text:
            raise PlanningError(
                f"the canary's fixed text is {fixed_text} tokens, "
                f"more than the {kw['target_tokens']} planned"
            )
        return await plan_prompt(kind, **kw)

    monkeypatch.setattr("kvwatch.probe.prompted.plan_prompt", template_with_a_long_system_prompt)
    _sim, targets, runner = rig
    target = targets["stale-pool"]
    target.state.discovery = await target.engine.discover()
    with capture_logs() as logs:
        reports = await runner.run_checked(target, UNDER)
    steps = [r for r in reports if r.kind is BISECT]
    refused = [e for e in logs if e["event"] == "served_window_planning_error"]
    unplanned = [r for r in steps if r.planned_prompt_tokens is None]
    assert [e["probe_id"] for e in refused] == [r.probe_id for r in unplanned]
    for event, step in zip(refused, unplanned, strict=True):
        assert f"more than the {event['size']} planned" in step.reason
    assert refused and refused[0]["size"] == POOL  # the pool was the first candidate
    assert len(steps) == probe_budget(WINDOW)
    assert all(r.planned_prompt_tokens >= fixed_text for r in steps if r.planned_prompt_tokens)
    record = store.served_windows("stale-pool")["stale-pool"]
    assert record.served_tokens <= POOL < (record.unserved_tokens or 0)
    assert record.probes == len(steps)
    again = await runner.run_checked(target, UNDER)
    assert BISECT not in [r.kind for r in again]


def _engine_dies_at_the_first_bisect_step(runner: ProbeRunner, sim: Any) -> None:
    """From the first bisect step on, the simulated ``head`` endpoint answers 5xx."""
    run = runner.run

    async def engine_dies_after_the_under_chain(
        t: Target, kind: ProbeKind, **kw: Any
    ) -> ProbeReport:
        if kind is BISECT:
            sim.set_fault("head", FaultMode.SERVER_ERROR)
        return await run(t, kind, **kw)

    runner.run = engine_dies_after_the_under_chain  # type: ignore[method-assign]


async def test_a_search_the_engine_cuts_short_hands_back_its_steps_and_stores_nothing(
    rig: tuple, store: Store
) -> None:
    """A step answered 5xx proves nothing: no window is stored (the next failure searches
    again), but the step ran and was stored, so the chain hands it back to be printed."""
    sim, targets, runner = rig
    target = targets["head"]
    assert (await runner.run(target, BASE)).verdict is Verdict.PASS
    _engine_dies_at_the_first_bisect_step(runner, sim)
    reports = await runner.run_checked(target, UNDER)
    steps = [r for r in reports if r.kind is BISECT]
    assert [r.verdict for r in steps] == [Verdict.ERROR]
    assert steps[0].probe_id is not None and get_probe(store, steps[0].probe_id) is not None
    assert store.served_windows("head") == {}


async def test_an_edge_failure_is_measured_at_the_reported_kv_pool_with_one_probe(
    rig: tuple, store: Store
) -> None:
    """The capacity check reports the pool, the edge probe (pool + 1) fails: the pool itself
    is the one candidate left to verify, and the under failure that follows searches no more."""
    _sim, targets, runner = rig
    target = targets["stale-pool"]
    assert (await runner.run(target, BASE)).verdict is Verdict.PASS
    chain = await runner.run_checked(target, ProbeKind.CAPACITY)
    edge = [r for r in chain if r.kind is ProbeKind.EDGE]
    assert edge and edge[-1].verdict is not Verdict.PASS
    steps = [r for r in chain if r.kind is BISECT]
    assert [(r.planned_prompt_tokens, r.verdict) for r in steps] == [(POOL, Verdict.PASS)]
    record = store.served_windows("stale-pool")["stale-pool"]
    assert (record.served_tokens, record.exact, record.probe_id) == (POOL, True, edge[-1].probe_id)
    under = await runner.run_checked(target, UNDER)
    assert BISECT not in [r.kind for r in under]


async def test_one_search_per_failure_streak_and_the_window_returns_when_it_ends(
    rig: tuple, store: Store
) -> None:
    """A second failure of the same streak spends no probes; a pass restores the advertised
    window; the next streak is measured again."""
    sim, targets, runner = rig
    target = targets["head"]
    await failing_under(runner, target)
    again = await runner.run_checked(target, UNDER)
    assert [r.kind for r in again] == [UNDER, UNDER]
    sim.set_fault("head", FaultMode.HEALTHY)
    passed = await runner.run_checked(target, UNDER)
    record = store.served_windows("head")["head"]
    assert (record.source, record.served_tokens) == ("recovered", WINDOW)
    assert record.probe_id == passed[0].probe_id
    sim.set_fault("head", FaultMode.TRUNCATE_HEAD)
    third = await runner.run_checked(target, UNDER)
    assert [r.kind for r in third].count(BISECT) == 2
    assert store.served_windows("head")["head"].served_tokens == POOL


async def test_bisect_probes_do_not_touch_the_per_probe_gauges(rig: tuple) -> None:
    """Search steps are evidence: only their tokens are counted, not their verdicts."""
    _sim, targets, runner = rig
    await failing_under(runner, targets["tail"])
    registry = runner.metrics.registry
    labels = {"endpoint": "tail", "probe": "bisect"}
    assert registry.get_sample_value("kvwatch_probe_success", labels) is None
    assert registry.get_sample_value("kvwatch_canary_tokens_total", {**labels, "type": "prompt"})


async def test_the_search_can_be_switched_off(store: Store) -> None:
    """served_window: false keeps the old behaviour: the failure alone, no bisect probes."""
    async with run_simulator(FLEET[:1]) as sim, httpx.AsyncClient(timeout=None) as client:
        config = config_for(
            [sim_endpoint_entry(sim, "head", served_window=False)],
            database="sqlite:///unused.db",
        )
        targets, runner, _ = targets_and_runner(config, store, client)
        reports = await failing_under(runner, targets["head"])
        assert BISECT not in [r.kind for r in reports]
        assert store.served_windows("head") == {}


async def test_the_alert_description_and_the_gauge_carry_the_served_window(db_url: str) -> None:
    """The firing alert's description names both windows; /metrics exports the served one."""
    async with run_simulator(FLEET[:1]) as sim:
        config = config_for([sim_endpoint_entry(sim, "head")], database=db_url)
        built = await build(config)
        try:
            target = built.targets[0]
            reports = await failing_under(built.runner, target)
            assert BISECT in [r.kind for r in reports]
            assert built.alerts is not None
            (alert,) = [s for s in built.alerts.records() if s.state == "firing"]
            assert alert.alertname == "KVWatchContextNotHonored"
            assert "advertised 16,384 · served 6,144" in alert.annotations["description"]
            stored = {s.alertname: s for s in built.store.load_alert_states()}
            assert stored[alert.alertname].annotations == alert.annotations
            # A later failure of the streak describes it too (not only the one annotated).
            later = await built.runner.run_checked(target, UNDER)
            assert BISECT not in [r.kind for r in later]
            (alert,) = [s for s in built.alerts.records() if s.state == "firing"]
            assert alert.last_probe_id == later[-1].probe_id
            assert alert.annotations["description"].count("served 6,144") == 1
            value = built.registry.get_sample_value(
                "kvwatch_endpoint_served_window_tokens", {"endpoint": "head"}
            )
            assert value == POOL
        finally:
            await built.clients.aclose()
            built.store.engine.dispose()


async def test_a_search_cut_short_after_a_recovery_puts_no_served_window_in_the_alert(
    db_url: str,
) -> None:
    """A new streak after the window was served again, whose search the engine cuts short:
    its alert says nothing about the served window (the latest record, "advertised again",
    is no measurement of this streak)."""
    async with run_simulator(FLEET[:1]) as sim:
        config = config_for([sim_endpoint_entry(sim, "head")], database=db_url)
        built = await build(config)
        try:
            target, runner = built.targets[0], built.runner
            await failing_under(runner, target)
            sim.set_fault("head", FaultMode.HEALTHY)
            await runner.run_checked(target, UNDER)
            assert built.store.served_windows("head")["head"].source == "recovered"
            sim.set_fault("head", FaultMode.TRUNCATE_HEAD)
            _engine_dies_at_the_first_bisect_step(runner, sim)
            reports = await runner.run_checked(target, UNDER)
            assert [r.verdict for r in reports if r.kind is BISECT] == [Verdict.ERROR]
            assert built.alerts is not None
            (alert,) = [s for s in built.alerts.records() if s.state == "firing"]
            assert "Served window" not in alert.annotations["description"]
        finally:
            await built.clients.aclose()
            built.store.engine.dispose()


async def test_a_restart_in_the_middle_of_a_streak_does_not_search_again(store: Store) -> None:
    """The streak's measurement is read from the database by a fresh runner (a restart, or
    another replica): the next failure spends no bisect probe, and its page describes it."""
    async with run_simulator(FLEET[:1]) as sim, httpx.AsyncClient(timeout=None) as client:
        config = config_for([sim_endpoint_entry(sim, "head")], database="sqlite:///unused.db")
        targets, runner, _ = targets_and_runner(config, store, client)
        assert BISECT in [r.kind for r in await failing_under(runner, targets["head"])]
        targets, runner, _ = targets_and_runner(config, store, client)
        assert targets["head"].served is not None  # read back when the targets are built
        again = await runner.run_checked(targets["head"], UNDER)
        assert [r.kind for r in again] == [UNDER, UNDER]
        assert targets["head"].served is not None
        assert targets["head"].served.served_tokens == POOL


@pytest.mark.parametrize("first", [ProbeKind.UNDER, ProbeKind.CAPACITY])
async def test_the_demo_stale_kv_endpoint_shows_a_served_window_after_its_first_failure(
    store: Store, first: ProbeKind
) -> None:
    """The demo's own stale-kv endpoint, before any baseline passed: whichever confirmed
    failure comes first (the under probe, or the edge probe after the capacity check), the
    endpoint page shows what it serves, no larger than its KV pool."""
    fleet = [ep for ep in demo_fleet() if ep.name == "stale-kv"]
    async with run_simulator(fleet) as sim, httpx.AsyncClient(timeout=None) as client:
        (ep,) = fleet
        urls = {ep.name: (sim.url_for(ep.name), ep.model, ep.window, ep.flavour.value)}
        targets, runner, _ = targets_and_runner(
            demo_config(urls, "sqlite:///unused.db"), store, client
        )
        reports = await runner.run_checked(targets["stale-kv"], first)
    steps = [r for r in reports if r.kind is BISECT]
    assert steps and Verdict.ERROR not in [r.verdict for r in steps]
    app = create_app(WebContext(store=store, registry=CollectorRegistry(), alive=lambda: True))
    with TestClient(app) as web:
        page = web.get("/endpoints/stale-kv").text
    served = re.search(r'data-served="(\d+)"', page)
    assert served is not None and 0 < int(served.group(1)) <= (ep.kv_pool or 0)
    assert "advertised 8,192 · served" in page
