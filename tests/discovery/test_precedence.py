"""Window and KV pool precedence for discovered endpoints, probing the simulator and storing
on both databases: the configuration wins, then the engine's own report, then the source."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.config import EndpointSpec
from kvwatch.daemon import build_targets
from kvwatch.engines.base import Discovery
from kvwatch.metrics import ProbeMetrics
from kvwatch.probe.model import Target
from kvwatch.probe.reported import with_source_figures
from kvwatch.probe.runner import ProbeRunner
from kvwatch.simulator.server import RunningSimulator, run_simulator
from kvwatch.simulator.spec import SimEndpoint
from kvwatch.store.repository import Store
from tests.helpers.store import get_probe
from tests.helpers.targets import config_for, sim_endpoint_entry

WINDOW = 8192


def discovered(sim: RunningSimulator, name: str, **fields: Any) -> EndpointSpec:
    """The simulator endpoint as a discovery source would list it: no configured window."""
    entry = sim_endpoint_entry(sim, name)
    del entry["context_window"]
    entry.update(fields.pop("entry", {}))
    config = config_for([entry], database="sqlite:///unused.db", defaults={"confirm": False})
    [spec] = config.resolved_endpoints()
    return dataclasses.replace(spec, source="sim", **fields)


def runner_for(
    specs: list[EndpointSpec], store: Store, client: httpx.AsyncClient
) -> tuple[dict[str, Target], ProbeRunner]:
    metrics = ProbeMetrics(CollectorRegistry())
    targets = build_targets(specs, store, lambda _name: client, metrics)
    return {t.spec.name: t for t in targets}, ProbeRunner(
        store=store, metrics=metrics, replica="test"
    )


def test_the_sources_figures_fill_only_what_the_engine_leaves_empty() -> None:
    """An engine's own window and pool are kept; missing ones come from the source, said so."""
    spec = dataclasses.replace(
        config_for(
            [{"name": "a", "url": "http://a:1/v1", "model": "m"}], database="sqlite:///u.db"
        ).resolved_endpoints()[0],
        source="gw",
        source_context_window=4096,
        source_kv_pool_tokens=2048,
    )
    engine = Discovery(context_window=8192, kv_pool_tokens=None)
    filled = with_source_figures(engine, spec)
    assert (filled.context_window, filled.kv_pool_tokens) == (8192, 2048)
    assert filled.detail == "KV pool 2048 as listed by discovery source gw"
    assert with_source_figures(Discovery(8192, 4096), spec) == Discovery(8192, 4096)


async def test_an_engine_silent_on_its_window_is_probed_at_the_sources_window(store: Store) -> None:
    """Anthropic's API states no window: the source's figure sizes the under probe, and
    without it the probe cannot be planned."""
    fleet = [SimEndpoint("claude", window=WINDOW, flavour="anthropic")]
    async with run_simulator(fleet) as sim, httpx.AsyncClient(timeout=None) as client:
        listed = discovered(
            sim, "claude", entry={"flavour": "anthropic"}, source_context_window=WINDOW
        )
        silent = dataclasses.replace(listed, name="claude-unlisted", source_context_window=None)
        targets, runner = runner_for([listed, silent], store, client)

        report = await runner.run(targets["claude"], ProbeKind.UNDER)
        assert report.verdict is Verdict.PASS, report.reason
        assert report.planned_prompt_tokens is not None
        assert WINDOW - 512 < report.planned_prompt_tokens < WINDOW
        unplanned = await runner.run(targets["claude-unlisted"], ProbeKind.UNDER)
        assert unplanned.verdict is not Verdict.PASS
        assert "context_window is not configured" in unplanned.reason


async def test_the_engines_own_window_wins_over_the_sources(store: Store) -> None:
    """vLLM states max_model_len: a stale, smaller source figure is not what is probed."""
    fleet = [SimEndpoint("vllm", window=WINDOW)]
    async with run_simulator(fleet) as sim, httpx.AsyncClient(timeout=None) as client:
        spec = discovered(sim, "vllm", entry={"flavour": "vllm"}, source_context_window=2048)
        targets, runner = runner_for([spec], store, client)
        report = await runner.run(targets["vllm"], ProbeKind.UNDER)
        assert report.verdict is Verdict.PASS, report.reason
        assert report.planned_prompt_tokens is not None
        assert report.planned_prompt_tokens > WINDOW - 512


async def test_the_configured_window_wins_over_the_engine_and_the_source(store: Store) -> None:
    """A template's context_window is configuration: it sizes the probe whatever else says."""
    fleet = [SimEndpoint("vllm", window=WINDOW)]
    async with run_simulator(fleet) as sim, httpx.AsyncClient(timeout=None) as client:
        spec = discovered(
            sim,
            "vllm",
            entry={"flavour": "vllm", "context_window": 4096},
            source_context_window=16384,
        )
        targets, runner = runner_for([spec], store, client)
        report = await runner.run(targets["vllm"], ProbeKind.UNDER)
        assert report.planned_prompt_tokens is not None
        assert 4096 - 512 < report.planned_prompt_tokens < 4096


async def test_the_sources_kv_pool_is_checked_when_the_engine_reports_none(store: Store) -> None:
    """A plain OpenAI-compatible engine states no pool; the source's smaller pool is the
    incident's precondition, and the capacity check is stored as a mismatch."""
    fleet = [SimEndpoint("plain", window=WINDOW, flavour="openai")]
    async with run_simulator(fleet) as sim, httpx.AsyncClient(timeout=None) as client:
        spec = discovered(sim, "plain", source_kv_pool_tokens=4096)
        targets, runner = runner_for([spec], store, client)
        report = await runner.run(targets["plain"], ProbeKind.CAPACITY)
        assert report.verdict is Verdict.CAPACITY_MISMATCH, report.reason
        assert report.probe_id is not None
        row = get_probe(store, report.probe_id)
        assert row is not None and row.verdict == "capacity_mismatch"
