"""Each engine's discovery against the simulator impersonating it, and the capacity check."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from kvwatch.canary.model import Verdict
from kvwatch.capacity import FindingKind, assess
from kvwatch.engines.base import Discovery
from kvwatch.engines.vllm import kv_pool_from_metrics
from kvwatch.simulator.server import RunningSimulator, run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from tests.engines.matrix_helpers import engine_for, run_probe

CONTEXT = 1_048_576
POOL = 681_280


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as http:
        yield http


@pytest.fixture
async def sim() -> AsyncIterator[RunningSimulator]:
    endpoints = [
        SimEndpoint(name="glm", model="glm-5.3", window=CONTEXT, kv_pool=POOL, flavour="sglang"),
        SimEndpoint(name="v", window=8192, kv_pool=4096, flavour="vllm"),
        SimEndpoint(name="l", window=4096, flavour="llamacpp"),
        SimEndpoint(name="t", window=8192, flavour="tgi"),
        SimEndpoint(name="o", window=8192, flavour="ollama"),
        SimEndpoint(name="a", window=200_000, flavour="anthropic"),
        SimEndpoint(name="oa", window=8192, flavour="openai"),
    ]
    async with run_simulator(endpoints) as running:
        yield running


@pytest.mark.parametrize(
    ("name", "flavour", "window", "pool"),
    [
        ("glm", "sglang", CONTEXT, POOL),
        ("v", "vllm", 8192, 4096),
        ("l", "llamacpp", 4096, 4096),
        ("t", "tgi", 8192, None),
        ("o", "ollama", 8192, None),
        ("a", "anthropic", None, None),
        ("oa", "openai", 8192, None),
    ],
)
async def test_each_engine_discovers_what_the_simulated_engine_reports(
    sim: RunningSimulator,
    client: httpx.AsyncClient,
    name: str,
    flavour: str,
    window: int | None,
    pool: int | None,
) -> None:
    """Window and KV pool come from each engine's own endpoints, in its own shapes."""
    model = next(e.model for e in sim.endpoints if e.name == name)
    engine = engine_for(client, sim.url_for(name), flavour, model=model)
    found = await engine.discover()
    assert (found.context_window, found.kv_pool_tokens) == (window, pool), found.detail
    assert found.model is not None


async def test_a_simulated_sglang_with_a_pool_smaller_than_its_window_is_a_capacity_mismatch(
    sim: RunningSimulator, client: httpx.AsyncClient
) -> None:
    """context_len 1,048,576 over max_total_num_tokens 681,280 is critical, with both numbers."""
    engine = engine_for(client, sim.url_for("glm"), "sglang", model="glm-5.3")
    findings = assess(None, None, await engine.discover())
    assert [f.kind for f in findings] == [FindingKind.CAPACITY_MISMATCH]
    assert findings[0].message == (
        "engine reports context_length 1048576 exceeds KV pool 681280 tokens; refusing to start"
    )
    assert findings[0].severity == "critical"


async def test_the_sglang_edge_probe_catches_the_stale_kv_fault_and_passes_when_healthy(
    sim: RunningSimulator, client: httpx.AsyncClient
) -> None:
    """The incident's gap: healthy SGLang rejects a 681,281-token prompt, stale_kv serves junk."""
    engine = engine_for(client, sim.url_for("glm"), "sglang", model="glm-5.3")
    found = await engine.discover()
    assert found.context_window is not None and found.kv_pool_tokens is not None
    plan, healthy = await run_probe(
        engine, "edge", window=found.context_window, pool=found.kv_pool_tokens
    )
    assert plan.planned_tokens == POOL + 1
    assert healthy.verdict is Verdict.PASS, healthy.reason
    sim.set_fault("glm", FaultMode.STALE_KV)
    _, faulty = await run_probe(
        engine, "edge", window=found.context_window, pool=found.kv_pool_tokens
    )
    assert faulty.verdict is Verdict.TRUNCATED, faulty.reason


def test_a_configured_window_that_disagrees_with_the_engine_is_a_warning() -> None:
    """Configuration wins, but a disagreement is reported with both numbers."""

    findings = assess(32768, None, Discovery(context_window=8192, kv_pool_tokens=65536))
    assert [(f.kind, f.message) for f in findings] == [
        (
            FindingKind.CONFIG_DISAGREES,
            "context_window is configured as 32768 but the engine reports 8192",
        ),
    ]


def test_a_configured_window_over_a_discovered_pool_is_a_mismatch() -> None:
    """An engine that reports only its pool still fails the gate against the configured window."""

    findings = assess(1_048_576, None, Discovery(kv_pool_tokens=681_280))
    assert findings[0].kind is FindingKind.CAPACITY_MISMATCH
    assert "1048576" in findings[0].message and "681280" in findings[0].message


def test_nothing_is_reported_when_window_and_pool_agree() -> None:
    """A correctly sized engine that matches its configuration yields no finding."""

    assert assess(8192, 8192, Discovery(context_window=8192, kv_pool_tokens=8192)) == []


def test_the_vllm_pool_is_blocks_times_block_size_and_the_smallest_engine_binds() -> None:
    """Two data-parallel engines: the smaller pool is the one a request can land on."""
    text = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100"} 1.0\n'
        'vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="90"} 1.0\n'
    )
    assert kv_pool_from_metrics(text) == (1440, None)


def test_an_unprofiled_vllm_cache_reports_no_pool() -> None:
    """num_gpu_blocks="None" (before profiling) is not a pool of zero."""
    text = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n'
    pool, why = kv_pool_from_metrics(text)
    assert pool is None and why is not None
