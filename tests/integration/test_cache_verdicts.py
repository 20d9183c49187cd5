"""The cache probe against the simulator: each verdict end to end, stored with its evidence.

Real HTTP to kvwatch's simulator (whose prefix cache keeps 16-token blocks and reports
cached tokens as vLLM and llama.cpp do), the real engine adapter and the real store (SQLite
and PostgreSQL).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import httpx
import pytest

from kvwatch.canary.model import CacheOutcome, ProbeKind, ProbeState, Verdict
from kvwatch.demo import demo_config
from kvwatch.simulator.fleet import demo_fleet
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import FaultMode, Flavour, SimEndpoint
from kvwatch.store.repository import Store
from tests.helpers.store import get_probe
from tests.helpers.targets import config_for, sim_endpoint_entry, targets_and_runner

CACHE = ProbeKind.CACHE

FLEET = [
    SimEndpoint("healthy", window=4096),
    SimEndpoint("llamacpp", window=4096, flavour=Flavour.LLAMACPP),
    SimEndpoint("collides", window=4096, fault=FaultMode.PREFIX_COLLISION),
    SimEndpoint("aborts", window=4096, fault=FaultMode.ABORT_REUSE),
    SimEndpoint("uncached", window=4096, prefix_cache=False),
    SimEndpoint("uncached-llamacpp", window=4096, prefix_cache=False, flavour=Flavour.LLAMACPP),
    SimEndpoint("weak", window=4096, fault=FaultMode.NO_RECALL),
    SimEndpoint("stale", window=4096, kv_pool=300, fault=FaultMode.STALE_KV),
]


@pytest.fixture
async def rig(store: Store) -> AsyncIterator[tuple]:
    async with run_simulator(FLEET) as sim, httpx.AsyncClient(timeout=None) as client:
        entries = [
            sim_endpoint_entry(sim, ep.name, probes=["cache"], cache={"document_tokens": 512})
            for ep in FLEET
        ]
        # Its baseline fits its KV pool (and leaves its pages there); the cache's does not.
        entries[-1]["baseline_tokens"] = 200
        config = config_for(entries, database="sqlite:///unused.db", defaults={"confirm": False})
        targets, runner, _metrics = targets_and_runner(config, store, client)
        yield sim, targets, runner, store


CASES = [
    ("healthy", Verdict.PASS),
    ("llamacpp", Verdict.PASS),
    ("collides", Verdict.CACHE_CORRUPT),
    ("aborts", Verdict.CACHE_CORRUPT),
    ("uncached", Verdict.CACHE_NOT_EXERCISED),
    ("uncached-llamacpp", Verdict.CACHE_NOT_EXERCISED),
    ("weak", Verdict.CANARY_INEFFECTIVE),
]


@pytest.mark.parametrize(("endpoint", "verdict"), CASES)
async def test_each_cache_fault_yields_its_verdict(rig, endpoint, verdict):
    """One cache cycle against one simulated endpoint gives its verdict, stored."""
    _sim, targets, runner, store = rig
    report = await runner.run(targets[endpoint], CACHE)
    assert report.verdict is verdict, report.reason
    row = get_probe(store, report.probe_id)
    assert row is not None and row.state is ProbeState.DONE
    assert row.verdict == verdict.value


async def test_a_healthy_cycle_stores_each_step_with_its_cache_hit(rig):
    """Cold misses, warm hits nearly the whole document, the branch only its shared part."""
    _sim, targets, runner, store = rig
    report = await runner.run(targets["healthy"], CACHE)
    row = get_probe(store, report.probe_id)
    assert row is not None
    steps = {s.step: s for s in row.cache}
    assert list(steps) == ["cold", "warm", "branch", "abort", "reuse"]
    assert steps["cold"].cached_tokens is None  # vLLM omits the details when 0 are cached
    assert steps["warm"].cached_tokens is not None and steps["warm"].cached_tokens > 400
    branch = steps["branch"].cached_tokens
    assert branch is not None and 0 < branch < steps["warm"].cached_tokens
    assert steps["abort"].outcome is CacheOutcome.ABORTED
    assert all(s.code_found for s in row.cache if s.step != "abort")
    assert row.cached_prompt_tokens == sum(s.cached_tokens or 0 for s in row.cache)


async def test_a_collision_answers_from_the_earlier_requests_pages(rig):
    """prefix_collision: past the shared part the cache serves the earlier request's pages.
    The warm step gets the cold step's question (A's other code), A' gets A's codes; the
    control (no hit) is right."""
    _sim, targets, runner, store = rig
    report = await runner.run(targets["collides"], CACHE)
    row = get_probe(store, report.probe_id)
    assert row is not None
    steps = {s.step: s for s in row.cache}
    cold, warm, branch = steps["cold"], steps["warm"], steps["branch"]
    assert cold.outcome is CacheOutcome.RIGHT
    assert warm.outcome is CacheOutcome.WRONG and warm.answered == (f"A {cold.key}",)
    assert branch.outcome is CacheOutcome.WRONG
    assert branch.answered and branch.answered[0].startswith("A ")
    assert steps["control"].outcome is CacheOutcome.RIGHT
    assert report.reason.startswith("the warm step, with ")


async def test_an_aborted_requests_pages_are_reused_wrong(rig):
    """abort_reuse: the reuse after the abort answers wrong; every other step is right."""
    _sim, targets, runner, store = rig
    report = await runner.run(targets["aborts"], CACHE)
    row = get_probe(store, report.probe_id)
    assert row is not None
    outcomes = {s.step: s.outcome for s in row.cache}
    assert outcomes["reuse"] is CacheOutcome.WRONG
    assert outcomes["cold"] is outcomes["warm"] is outcomes["branch"] is CacheOutcome.RIGHT
    assert outcomes["control"] is CacheOutcome.RIGHT
    assert "the reuse step" in report.reason


async def test_another_probes_marker_in_a_cache_answer_is_a_foreign_marker(rig):
    """A baseline probe leaves its pages; a stale-KV engine serves them to the next request
    past its pool: the cache probe's answer holds the baseline probe's marker."""
    _sim, targets, runner, _store = rig
    baseline = await runner.run(targets["stale"], ProbeKind.BASELINE)
    report = await runner.run(targets["stale"], CACHE)
    assert report.verdict is Verdict.FOREIGN_MARKER, report.reason
    assert [f.probe_id for f in report.foreign] == [baseline.probe_id]
    assert report.reason.startswith("the cold step was answered with the marker of probe")


async def test_every_code_of_a_cycle_names_its_probe_when_it_leaks(rig):
    """Each planted code is stored with the probe before any request goes out."""
    _sim, targets, runner, store = rig
    report = await runner.run(targets["healthy"], CACHE)
    row = get_probe(store, report.probe_id)
    assert row is not None
    issued = store.lookup_markers([s.expected for s in row.cache])
    assert {m.probe_id for m in issued.values()} == {report.probe_id}
    assert len(issued) == 5  # cold, warm, branch, abort, reuse each ask another code


async def test_the_returning_session_asks_an_earlier_documents_fact(rig):
    """With return_after, a later cycle asks the first cycle's document again."""
    _sim, targets, runner, store = rig
    target = targets["healthy"]
    spec = dataclasses.replace(target.spec, cache_return_after=0.001)
    target = dataclasses.replace(target, spec=spec)
    first = await runner.run(target, CACHE)
    second = await runner.run(target, CACHE)
    row = get_probe(store, second.probe_id)
    assert first.verdict is second.verdict is Verdict.PASS, second.reason
    assert row is not None and row.cache[-1].step == "return"
    assert row.cache[-1].outcome is CacheOutcome.RIGHT
    assert row.cache[-1].cached_tokens is not None and row.cache[-1].cached_tokens > 400


async def test_the_demo_runs_the_cache_probe_on_its_cache_endpoints(store):
    """Zero-config demo: healthy passes, prefix-collision and abort-reuse are cache_corrupt
    (confirmed), prefix-cache-off is cache_not_exercised; the others keep their probes."""
    names = ("healthy", "prefix-collision", "abort-reuse", "prefix-cache-off", "stale-kv")
    fleet = [ep for ep in demo_fleet() if ep.name in names]
    async with run_simulator(fleet) as sim, httpx.AsyncClient(timeout=None) as client:
        urls = {
            ep.name: (sim.url_for(ep.name), ep.model, ep.window, ep.flavour.value) for ep in fleet
        }
        config = demo_config(urls, "sqlite:///unused.db")
        targets, runner, _ = targets_and_runner(config, store, client)
        verdicts = {
            name: [r.verdict for r in await runner.run_checked(targets[name], CACHE)]
            for name in names[:4]
        }
    assert verdicts == {
        "healthy": [Verdict.PASS],
        "prefix-collision": [Verdict.CACHE_CORRUPT, Verdict.CACHE_CORRUPT],
        "abort-reuse": [Verdict.CACHE_CORRUPT, Verdict.CACHE_CORRUPT],
        "prefix-cache-off": [Verdict.CACHE_NOT_EXERCISED],
    }
    assert CACHE not in targets["stale-kv"].spec.probes
