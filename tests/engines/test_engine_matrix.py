"""Every probe kind against every engine flavour (and API) of the simulator, healthy and faulty.

Each row goes the whole way a real probe goes, minus the store: the engine adapter, the
engine's own tokenize endpoint (a local count for Ollama, which has none), the planner, the
simulated engine and the pure verdict (or the edge verdict).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from kvwatch.canary.model import Verdict
from kvwatch.simulator.server import RunningSimulator, run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from tests.engines.matrix_helpers import engine_for, run_probe

WINDOW = 2048
POOL = 1024

# (flavour, api): every adapter the factory can build.
ENGINES = [
    ("openai", "chat"),
    ("openai", "completions"),
    ("vllm", "chat"),
    ("vllm", "completions"),
    ("sglang", "chat"),
    ("llamacpp", "chat"),
    ("llamacpp", "completions"),
    ("tgi", "chat"),
    ("tgi", "generate"),
    ("ollama", "native"),
    ("anthropic", "native"),
]


def _ids(row: tuple[str, str]) -> str:
    return f"{row[0]}-{row[1]}"


@pytest.fixture
async def sim() -> AsyncIterator[RunningSimulator]:
    endpoints = []
    for flavour in {f for f, _ in ENGINES}:
        endpoints.append(SimEndpoint(name=f"{flavour}-full", window=WINDOW, flavour=flavour))
        endpoints.append(
            SimEndpoint(name=f"{flavour}-small", window=WINDOW, kv_pool=POOL, flavour=flavour)
        )
    async with run_simulator(endpoints) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as http:
        yield http


def _expected_over(flavour: str, fault: FaultMode) -> Verdict:
    if fault is FaultMode.ACCEPT_OVER_LIMIT:
        return Verdict.OVER_ACCEPTED
    # Ollama never refuses a prompt: it cuts it to the window (docs/engines.md), which is
    # all its over probe can show.
    if flavour == "ollama":
        return Verdict.OVER_TRUNCATED
    return Verdict.PASS


@pytest.mark.parametrize("fault", [FaultMode.HEALTHY, FaultMode.ACCEPT_OVER_LIMIT])
@pytest.mark.parametrize("kind", ["under", "over", "baseline"])
@pytest.mark.parametrize("row", ENGINES, ids=_ids)
async def test_each_boundary_probe_gets_the_expected_verdict_on_a_correctly_sized_engine(
    sim: RunningSimulator,
    client: httpx.AsyncClient,
    row: tuple[str, str],
    kind: str,
    fault: FaultMode,
) -> None:
    """Under and baseline pass; over passes, is over_truncated on Ollama, and is over_accepted
    when the engine reads a prompt beyond its window."""
    flavour, api = row
    sim.set_fault(f"{flavour}-full", fault)
    engine = engine_for(client, sim.url_for(f"{flavour}-full"), flavour, api)
    # Streamed on odd rows only: both readers of every API are covered at half the cost.
    stream = ENGINES.index(row) % 2 == 1
    _, judgement = await run_probe(engine, kind, window=WINDOW, stream=stream)
    expected = _expected_over(flavour, fault) if kind == "over" else Verdict.PASS
    assert judgement.verdict is expected, judgement.reason


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("row", ENGINES, ids=_ids)
async def test_the_edge_probe_passes_on_a_healthy_engine_whose_pool_is_smaller(
    sim: RunningSimulator, client: httpx.AsyncClient, row: tuple[str, str], stream: bool
) -> None:
    """At the edge a healthy engine answers from the whole prompt, or (SGLang) rejects it."""
    flavour, api = row
    engine = engine_for(client, sim.url_for(f"{flavour}-small"), flavour, api)
    plan, judgement = await run_probe(engine, "edge", window=WINDOW, pool=POOL, stream=stream)
    assert plan.planned_tokens > POOL
    assert judgement.verdict is Verdict.PASS, judgement.reason
    if flavour == "sglang":
        assert "rejected" in judgement.reason


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("kind", ["edge"])
@pytest.mark.parametrize("row", ENGINES, ids=_ids)
async def test_stale_kv_past_the_pool_is_caught_as_truncated(
    sim: RunningSimulator,
    client: httpx.AsyncClient,
    row: tuple[str, str],
    kind: str,
    stream: bool,
) -> None:
    """A prompt over the pool swapped for a placeholder is critical, whatever the engine."""
    flavour, api = row
    sim.set_fault(f"{flavour}-small", FaultMode.STALE_KV)
    engine = engine_for(client, sim.url_for(f"{flavour}-small"), flavour, api)
    _, judgement = await run_probe(engine, kind, window=WINDOW, pool=POOL, stream=stream)
    assert judgement.verdict is Verdict.TRUNCATED, judgement.reason


@pytest.mark.parametrize("row", ENGINES, ids=_ids)
async def test_baseline_still_passes_on_a_stale_kv_engine(
    sim: RunningSimulator, client: httpx.AsyncClient, row: tuple[str, str]
) -> None:
    """A short prompt fits the pool, so the stale-KV fault leaves it untouched."""
    flavour, api = row
    sim.set_fault(f"{flavour}-small", FaultMode.STALE_KV)
    engine = engine_for(client, sim.url_for(f"{flavour}-small"), flavour, api)
    _, judgement = await run_probe(engine, "baseline", window=WINDOW, pool=POOL)
    assert judgement.verdict is Verdict.PASS, judgement.reason
