"""Against the simulator, each fault mode yields its DESIGN §2 verdict, end to end.

Real HTTP to kvwatch's simulator, the real engine adapter and server token counter, and the
real store (SQLite and PostgreSQL): only the LLM is simulated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import httpx
import pytest

from kvwatch.canary.model import ProbeKind, ProbeState, Verdict
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from kvwatch.store.repository import Store
from tests.helpers.store import get_probe
from tests.helpers.targets import config_for, sim_endpoint_entry, targets_and_runner

UNDER, OVER, BASE = ProbeKind.UNDER, ProbeKind.OVER, ProbeKind.BASELINE

FLEET = [
    SimEndpoint("healthy", window=4096),
    SimEndpoint("stale", window=8192, kv_pool=6144, fault=FaultMode.STALE_KV),
    SimEndpoint("head", window=8192, kv_pool=6144, fault=FaultMode.TRUNCATE_HEAD),
    SimEndpoint(
        "head-lying", window=8192, kv_pool=6144, fault=FaultMode.TRUNCATE_HEAD, report_usage="sent"
    ),
    SimEndpoint("tail", window=8192, kv_pool=6144, fault=FaultMode.TRUNCATE_TAIL),
    SimEndpoint("over-ok", window=4096, fault=FaultMode.ACCEPT_OVER_LIMIT),
    SimEndpoint("frame", window=8192, kv_pool=6144, fault=FaultMode.STREAM_ERROR_FRAME),
    SimEndpoint("status", window=4096, fault=FaultMode.WRONG_STATUS),
    SimEndpoint("not-served", window=8192, kv_pool=6144, fault=FaultMode.WINDOW_NOT_SERVED),
    SimEndpoint("weak", window=4096, fault=FaultMode.NO_RECALL),
    SimEndpoint("busy", window=4096, fault=FaultMode.THROTTLED),
    SimEndpoint("broken", window=4096, fault=FaultMode.SERVER_ERROR),
    SimEndpoint("locked", window=4096, api_key="right-key"),
    SimEndpoint("llama", window=4096, flavour="llamacpp"),
]


@pytest.fixture
async def rig(store: Store) -> AsyncIterator[tuple]:
    async with run_simulator(FLEET) as sim, httpx.AsyncClient(timeout=None) as client:
        entries = [sim_endpoint_entry(sim, ep.name) for ep in FLEET]
        for entry in entries:
            if entry["name"] == "locked":
                entry["api_key"] = "wrong-key"
            if entry["name"] == "llama":
                entry["flavour"] = "llamacpp"
        config = config_for(entries, database="sqlite:///unused.db", defaults={"confirm": False})
        targets, runner, _metrics = targets_and_runner(config, store, client)
        yield sim, targets, runner, store


CASES = [
    ("healthy", UNDER, Verdict.PASS),
    ("healthy", OVER, Verdict.PASS),
    ("healthy", BASE, Verdict.PASS),
    ("llama", UNDER, Verdict.PASS),
    ("llama", OVER, Verdict.PASS),
    ("head", UNDER, Verdict.TRUNCATED),
    ("head-lying", UNDER, Verdict.MARKER_MISSING),
    ("tail", UNDER, Verdict.TRUNCATED),
    ("over-ok", OVER, Verdict.OVER_ACCEPTED),
    ("frame", UNDER, Verdict.STREAM_ERROR),
    ("status", OVER, Verdict.WRONG_REJECTION),
    ("not-served", UNDER, Verdict.UNDER_REJECTED),
    ("weak", BASE, Verdict.CANARY_INEFFECTIVE),
    ("weak", UNDER, Verdict.MARKER_MISSING),
    ("busy", UNDER, Verdict.THROTTLED),
    ("broken", UNDER, Verdict.ERROR),
    ("locked", BASE, Verdict.AUTH_ERROR),
]


@pytest.mark.parametrize(("endpoint", "kind", "verdict"), CASES)
async def test_each_fault_mode_yields_its_verdict(rig, endpoint, kind, verdict):
    """One probe against one simulated fault gives the verdict DESIGN §2 names, stored."""
    _sim, targets, runner, store = rig
    report = await runner.run(targets[endpoint], kind)
    assert report.verdict is verdict, report.reason
    row = get_probe(store, report.probe_id)
    assert row is not None
    assert row.state is ProbeState.DONE
    assert row.verdict == verdict.value


async def test_stale_kv_leaks_an_earlier_probes_marker_and_names_it(rig):
    """The incident: the under probe's answer carries the baseline's marker, caught as a leak."""
    _sim, targets, runner, store = rig
    baseline = await runner.run(targets["stale"], BASE)
    assert baseline.verdict is Verdict.PASS
    under = await runner.run(targets["stale"], UNDER)
    assert under.verdict is Verdict.FOREIGN_MARKER
    assert [f.probe_id for f in under.foreign] == [baseline.probe_id]
    assert under.reported_prompt_tokens == 1
    row = get_probe(store, under.probe_id)
    assert row is not None and row.foreign_markers[0].probe_id == baseline.probe_id


async def test_stale_kv_with_nothing_to_leak_is_still_caught_as_truncation(rig):
    """A fresh engine has no stale pages: the one-token placeholder shows as truncated."""
    _sim, targets, runner, _store = rig
    report = await runner.run(targets["stale"], UNDER)
    assert report.verdict is Verdict.TRUNCATED
    assert report.reported_prompt_tokens == 1


async def test_a_critical_verdict_is_confirmed_by_a_second_stored_probe(rig):
    """run_checked re-checks a critical failure at once; both probes are stored and linked."""
    _sim, targets, runner, store = rig
    target = targets["over-ok"]
    target = dataclasses.replace(target, spec=dataclasses.replace(target.spec, confirm=True))
    reports = await runner.run_checked(target, OVER)
    assert [r.verdict for r in reports] == [Verdict.OVER_ACCEPTED, Verdict.OVER_ACCEPTED]
    assert reports[1].confirms_probe_id == reports[0].probe_id
    second = get_probe(store, reports[1].probe_id)
    assert second is not None and second.confirms_probe_id == reports[0].probe_id


async def test_a_passing_probe_is_not_confirmed(rig):
    """Only critical verdicts trigger a confirmation probe."""
    _sim, targets, runner, _store = rig
    target = targets["healthy"]
    target = dataclasses.replace(target, spec=dataclasses.replace(target.spec, confirm=True))
    assert len(await runner.run_checked(target, OVER)) == 1


@pytest.mark.parametrize("window", [4096, 131_072])
async def test_planned_and_reported_prompt_tokens_differ_by_zero(store, window):
    """With a tokenize endpoint, the plan is exact: usage equals plan for under and baseline."""
    async with (
        run_simulator([SimEndpoint("exact", window=window)]) as sim,
        httpx.AsyncClient(timeout=None) as client,
    ):
        config = config_for([sim_endpoint_entry(sim, "exact")], database="sqlite:///unused.db")
        targets, runner, _ = targets_and_runner(config, store, client)
        for kind in (UNDER, BASE):
            report = await runner.run(targets["exact"], kind)
            assert report.verdict is Verdict.PASS, report.reason
            assert report.reported_prompt_tokens == report.planned_prompt_tokens
        over = await runner.run(targets["exact"], OVER)
        assert over.verdict is Verdict.PASS
        assert over.planned_prompt_tokens == window - 32 + 1


async def test_a_tgi_whose_input_cap_is_below_its_total_is_probed_at_the_cap(store):
    """TGI's old defaults (1,024 input of 2,048 total), window discovered: no false page."""
    tgi = SimEndpoint("tgi", window=2048, flavour="tgi", max_input_tokens=1024)
    async with run_simulator([tgi]) as sim, httpx.AsyncClient(timeout=None) as client:
        entry = sim_endpoint_entry(sim, "tgi", flavour="tgi")
        del entry["context_window"]  # discovered from /info
        config = config_for([entry], database="sqlite:///unused.db", defaults={"confirm": False})
        targets, runner, _ = targets_and_runner(config, store, client)
        under = await runner.run(targets["tgi"], UNDER)
        assert under.verdict is Verdict.PASS, under.reason
        assert under.planned_prompt_tokens == under.reported_prompt_tokens == 1024
        over = await runner.run(targets["tgi"], OVER)
        assert over.verdict is Verdict.PASS, over.reason
        assert over.planned_prompt_tokens == 1025
        row = get_probe(store, over.probe_id)
        assert row is not None and "must have less than 1024 tokens" in (row.error_body or "")
