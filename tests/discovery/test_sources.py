"""Each kind of source over real HTTP (or real files): add, change, remove; a source that
is down or serves a bad list keeps the last good list, and says why."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from kvwatch.config import Config, parse_config
from kvwatch.discovery.loop import DiscoveryLoop
from kvwatch.discovery.sources import FetchError, FileSource, Source, build_source
from kvwatch.metrics import DiscoveryMetrics
from kvwatch.simulator.server import RunningSimulator, run_simulator
from kvwatch.simulator.spec import SimEndpoint

FLEET = [
    SimEndpoint("glm", model="glm-5.3", window=16384, kv_pool=12288),
    SimEndpoint("qwen", model="qwen3", window=8192, flavour="sglang"),
]


@pytest.fixture
async def sim() -> AsyncIterator[RunningSimulator]:
    async with run_simulator(FLEET) as running:
        yield running


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as http:
        yield http


def config(*sources: dict[str, Any]) -> Config:
    return parse_config(yaml.safe_dump({"discovery": list(sources)}), source="<test>")


def source_for(cfg: Config, client: httpx.AsyncClient) -> Source:
    return build_source(cfg.discovery[0], cfg.defaults, client)


async def put_listing(sim: RunningSimulator, client: httpx.AsyncClient, **listing: Any) -> None:
    response = await client.put(f"{sim.base_url}/_sim/listing", json=listing)
    response.raise_for_status()


class Changes:
    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> bool:
        self.calls += 1
        return True


def loop_of(source: Source) -> tuple[DiscoveryLoop, CollectorRegistry]:
    registry = CollectorRegistry()
    return DiscoveryLoop(
        [source], on_change=Changes(), metrics=DiscoveryMetrics(registry)
    ), registry


def metric(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def test_http_sd_lists_the_simulators_endpoints_and_sends_prometheus_refresh_header(
    sim: RunningSimulator, client: httpx.AsyncClient
) -> None:
    """Each target becomes the endpoint its labels describe; the request carries the interval."""
    cfg = config(
        {
            "name": "sim",
            "http_sd": {"url": f"{sim.base_url}/_sim/http_sd", "refresh_interval": "30s"},
        }
    )
    specs = await source_for(cfg, client).fetch()
    assert specs is not None
    assert [(s.name, s.url, s.model, s.flavour) for s in specs] == [
        ("glm", sim.url_for("glm"), "glm-5.3", "vllm"),
        ("qwen", sim.url_for("qwen"), "qwen3", "sglang"),
    ]
    assert [(s.source_context_window, s.source_kv_pool_tokens) for s in specs] == [
        (16384, 12288),
        (8192, None),
    ]
    assert dict(specs[0].labels) == {"simulated": "true"}
    seen = (await client.get(f"{sim.base_url}/_sim/listing")).json()
    assert seen["last_refresh_header"] == "30"


async def test_http_sd_adds_changes_and_removes_endpoints_as_the_list_does(
    sim: RunningSimulator, client: httpx.AsyncClient
) -> None:
    """The loop's endpoints follow the list; an unchanged list is no change."""
    cfg = config({"name": "sim", "http_sd": {"url": f"{sim.base_url}/_sim/http_sd"}})
    source = source_for(cfg, client)
    loop, registry = loop_of(source)

    await put_listing(sim, client, endpoints=["glm"])
    assert await loop.refresh(source) is True
    assert [s.name for s in loop.endpoints()] == ["glm"]
    assert await loop.refresh(source) is False

    await put_listing(sim, client, endpoints=["glm", "qwen"])
    assert await loop.refresh(source) is True
    assert [s.name for s in loop.endpoints()] == ["glm", "qwen"]

    await put_listing(sim, client, endpoints=["glm", "qwen"], windows=False)
    assert await loop.refresh(source) is True
    assert [s.source_context_window for s in loop.endpoints()] == [None, None]

    await put_listing(sim, client, endpoints=["qwen"])
    assert await loop.refresh(source) is True
    assert [s.name for s in loop.endpoints()] == ["qwen"]
    assert metric(registry, "kvwatch_discovery_endpoints", source="sim") == 1
    assert metric(registry, "kvwatch_discovery_last_refresh_successful", source="sim") == 1


async def test_a_source_that_is_down_keeps_the_last_good_list_and_counts_the_failure(
    sim: RunningSimulator, client: httpx.AsyncClient
) -> None:
    """A 503 changes nothing; the failure is counted by reason and the success gauge drops."""
    cfg = config({"name": "sim", "http_sd": {"url": f"{sim.base_url}/_sim/http_sd"}})
    source = source_for(cfg, client)
    loop, registry = loop_of(source)
    assert await loop.refresh(source) is True
    before = loop.endpoints()

    await put_listing(sim, client, status=503, body="upstream down")
    with capture_logs() as logs:
        assert await loop.refresh(source) is False
    assert loop.endpoints() == before
    assert metric(registry, "kvwatch_discovery_last_refresh_successful", source="sim") == 0
    assert (
        metric(
            registry, "kvwatch_discovery_refresh_failures_total", source="sim", reason="http_status"
        )
        == 1
    )
    assert metric(registry, "kvwatch_discovery_endpoints", source="sim") == 2
    [failure] = [e for e in logs if e["event"] == "discovery_refresh_failed"]
    assert failure["error"] == f"{sim.base_url}/_sim/http_sd: HTTP 503"
    assert failure["kept"] == 2


async def test_an_unreachable_source_keeps_the_last_good_list(
    sim: RunningSimulator, client: httpx.AsyncClient
) -> None:
    """A refused connection is a failure with reason unreachable, and changes nothing."""
    cfg = config({"name": "sim", "http_sd": {"url": f"{sim.base_url}/_sim/http_sd"}})
    source = source_for(cfg, client)
    loop, registry = loop_of(source)
    assert await loop.refresh(source) is True
    gone = config({"name": "sim", "http_sd": {"url": "http://127.0.0.1:9/targets"}})
    assert await loop.refresh(source_for(gone, client)) is False
    assert [s.name for s in loop.endpoints()] == ["glm", "qwen"]
    assert (
        metric(
            registry, "kvwatch_discovery_refresh_failures_total", source="sim", reason="unreachable"
        )
        == 1
    )


async def test_a_bad_list_is_a_clear_error_and_changes_nothing(
    sim: RunningSimulator, client: httpx.AsyncClient
) -> None:
    """A list of the wrong shape, or with a target that cannot be an endpoint, is refused whole."""
    cfg = config({"name": "sim", "http_sd": {"url": f"{sim.base_url}/_sim/http_sd"}})
    source = source_for(cfg, client)
    loop, registry = loop_of(source)
    assert await loop.refresh(source) is True
    before = loop.endpoints()
    url = f"{sim.base_url}/_sim/http_sd"

    await put_listing(sim, client, body=json.dumps([{"targets": "glm:8000"}]))
    with pytest.raises(FetchError) as caught:
        await source.fetch()
    assert caught.value.reason == "invalid"
    assert str(caught.value) == f'{url}: group 1: "targets" must be a list of "host:port" strings'

    good = {"targets": ["10.0.0.1:8000"], "labels": {"__kvwatch_model": "m"}}
    bad = {"targets": ["10.0.0.2:8000"], "labels": {}}
    await put_listing(sim, client, body=json.dumps([good, bad]))
    with capture_logs() as logs:
        assert await loop.refresh(source) is False
    [failure] = [e for e in logs if e["event"] == "discovery_refresh_failed"]
    assert failure["error"] == (
        f'{url}: group 2, target "10.0.0.2:8000": needs the __kvwatch_model label '
        "(the model to probe)"
    )
    assert loop.endpoints() == before
    assert (
        metric(registry, "kvwatch_discovery_refresh_failures_total", source="sim", reason="invalid")
        == 1
    )


@pytest.mark.parametrize(
    ("api", "path"),
    [("openai", "/_gateway/v1"), ("litellm", "/_gateway"), ("openrouter", "/_gateway")],
)
async def test_a_gateway_list_in_each_dialect_gives_its_models_and_windows(
    sim: RunningSimulator, client: httpx.AsyncClient, api: str, path: str
) -> None:
    """vLLM's /v1/models, LiteLLM's /model/info and OpenRouter's /models over real HTTP."""
    url = f"{sim.base_url}{path}"
    cfg = config(
        {
            "name": "gw",
            "gateway": {"url": url, "api": api, "exclude": ["qwen*"]},
            "template": {"api_key": "sk-gw"},
        }
    )
    specs = await source_for(cfg, client).fetch()
    assert specs is not None
    assert [(s.name, s.url, s.model, s.source_context_window) for s in specs] == [
        ("gw-glm-5.3", url, "glm-5.3", 16384)
    ]
    await put_listing(sim, client, windows=False)
    specs = await source_for(cfg, client).fetch()
    assert specs is not None
    assert [s.source_context_window for s in specs] == [None]


async def test_file_sd_rereads_a_file_when_it_changes_and_only_then(tmp_path: Path) -> None:
    """An untouched file is not re-read; a changed one is; an emptied directory lists none."""
    targets = tmp_path / "targets"
    targets.mkdir()
    path = targets / "fleet.yaml"
    path.write_text("- targets: ['10.0.0.1:8000']\n  labels: {__kvwatch_model: glm}\n")
    cfg = parse_config(
        yaml.safe_dump({"discovery": [{"name": "k8s", "file_sd": {"files": ["targets/*.yaml"]}}]}),
        source="<test>",
        base_dir=tmp_path,
    )
    now = [0.0]
    source = FileSource(cfg.discovery[0], cfg.defaults, clock=lambda: now[0])
    first = await source.fetch()
    assert first is not None and [s.name for s in first] == ["k8s-10.0.0.1-8000"]
    assert await source.fetch() is None

    path.write_text(
        "- targets: ['10.0.0.1:8000', '10.0.0.2:8000']\n  labels: {__kvwatch_model: glm}\n"
    )
    os.utime(path, ns=(1, 1))  # a new mtime even within the filesystem's time resolution
    second = await source.fetch()
    assert second is not None and len(second) == 2

    path.write_text("- targets: 7\n")
    os.utime(path, ns=(2, 2))
    with pytest.raises(FetchError, match=f'^{path}: group 1: "targets" must be a list'):
        await source.fetch()

    path.unlink()
    assert await source.fetch() == []


async def test_a_change_whose_apply_failed_is_applied_again_at_the_next_poll(
    sim: RunningSimulator, client: httpx.AsyncClient
) -> None:
    """The list does not change again to prompt it: the loop retries a failed apply itself."""
    cfg = config(
        {
            "name": "sim",
            "http_sd": {"url": f"{sim.base_url}/_sim/http_sd", "refresh_interval": "100ms"},
        }
    )
    outcomes = [False, True]
    applied: list[int] = []

    async def apply() -> bool:
        applied.append(len(loop.endpoints()))
        return outcomes.pop(0) if outcomes else True

    loop = DiscoveryLoop(
        [source_for(cfg, client)], on_change=apply, metrics=DiscoveryMetrics(CollectorRegistry())
    )
    loop.start()
    try:
        for _ in range(50):
            if len(applied) >= 2:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
    finally:
        await loop.stop()
    # Once failed, once again at the next poll, then nothing more: the list did not change.
    assert applied == [2, 2]
