"""The continuous capacity check, end to end: engine self-report → verdict → edge probe."""

from __future__ import annotations

import httpx

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from tests.helpers.store import get_probe
from tests.helpers.targets import config_for, sim_endpoint_entry, targets_and_runner

INCIDENT = SimEndpoint(
    "glm", window=1_048_576, kv_pool=681_280, fault=FaultMode.STALE_KV, flavour="sglang"
)


async def test_sglang_with_a_pool_below_its_window_is_a_capacity_mismatch_and_edge_catches_stale_kv(
    store,
):
    """The incident's numbers: capacity_mismatch with both, then the edge probe (just over the
    pool) catches the stale_kv fault."""
    fleet = [INCIDENT, SimEndpoint("warm", window=4096, flavour="sglang")]
    async with run_simulator(fleet) as sim, httpx.AsyncClient(timeout=None) as client:
        entry = sim_endpoint_entry(sim, "glm", flavour="sglang")
        config = config_for(
            [entry, sim_endpoint_entry(sim, "warm", flavour="sglang")],
            database="sqlite:///unused.db",
            defaults={"confirm": False},
        )
        targets, runner, _ = targets_and_runner(config, store, client)
        # Something for stale pages to leak: a baseline on the incident endpoint.
        assert (await runner.run(targets["glm"], ProbeKind.BASELINE)).verdict is Verdict.PASS
        reports = await runner.run_checked(targets["glm"], ProbeKind.CAPACITY)
        assert [r.kind for r in reports] == [ProbeKind.CAPACITY, ProbeKind.EDGE, ProbeKind.BISECT]
        capacity, edge, step = reports
        assert capacity.verdict is Verdict.CAPACITY_MISMATCH
        assert "1048576" in capacity.reason and "681280" in capacity.reason
        assert edge.verdict in {Verdict.FOREIGN_MARKER, Verdict.TRUNCATED}, edge.reason
        assert edge.planned_prompt_tokens is not None and edge.planned_prompt_tokens > 681_280
        row = get_probe(store, capacity.probe_id)
        assert row is not None and row.verdict == "capacity_mismatch" and row.marker == ""
        # What it really serves: the reported pool, verified whole by one bisect probe (the
        # edge probe already proved one token more is not).
        assert (step.planned_prompt_tokens, step.verdict) == (681_280, Verdict.PASS)
        assert step.trigger_probe_id == edge.probe_id
        assert store.served_windows("glm")["glm"].served_tokens == 681_280

        healthy = await runner.run_checked(targets["warm"], ProbeKind.CAPACITY)
        assert [r.verdict for r in healthy] == [Verdict.PASS]


async def test_a_healthy_sglang_edge_is_not_probed_and_its_capacity_passes(store):
    """No gap between pool and window: the capacity check passes and no edge probe runs."""
    fleet = [SimEndpoint("ok", window=8192, flavour="sglang")]
    async with run_simulator(fleet) as sim, httpx.AsyncClient(timeout=None) as client:
        entry = sim_endpoint_entry(sim, "ok", flavour="sglang")
        config = config_for([entry], database="sqlite:///unused.db")
        targets, runner, _ = targets_and_runner(config, store, client)
        reports = await runner.run_checked(targets["ok"], ProbeKind.CAPACITY)
        assert [(r.kind, r.verdict) for r in reports] == [(ProbeKind.CAPACITY, Verdict.PASS)]
        assert "fits the KV pool" in reports[0].reason


async def test_an_engine_that_reports_no_pool_stores_no_capacity_row(store):
    """A generic OpenAI endpoint reports no KV pool: nothing is compared, nothing stored."""
    fleet = [SimEndpoint("plain", window=4096, flavour="openai")]
    async with run_simulator(fleet) as sim, httpx.AsyncClient(timeout=None) as client:
        config = config_for([sim_endpoint_entry(sim, "plain")], database="sqlite:///unused.db")
        targets, runner, _ = targets_and_runner(config, store, client)
        assert await runner.run_checked(targets["plain"], ProbeKind.CAPACITY) == []
        assert store.list_probes(endpoint="plain") == []
