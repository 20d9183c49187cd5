"""Proxy mode against kvwatch's own simulator as the upstream engine.

The real-model versions of these verdicts are in tests/realengine/test_proxy_faults.py; here
the upstream is the simulator (llama.cpp flavour), so every fault path runs in milliseconds.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from click.testing import CliRunner

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.probe.model import Target
from kvwatch.probe.runner import ProbeRunner
from kvwatch.simulator.command import serve, simulate
from kvwatch.simulator.proxy import PROXY_FAULTS, RunningProxy, run_proxy
from kvwatch.simulator.server import RunningSimulator, run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from kvwatch.store.repository import Store
from tests.helpers.store import get_probe
from tests.helpers.targets import config_for, sim_endpoint_entry, targets_and_runner

UNDER, OVER, BASE = ProbeKind.UNDER, ProbeKind.OVER, ProbeKind.BASELINE
WINDOW, POOL = 4096, 3072


def proxied(name: str, fault: FaultMode, **extra: str | int) -> SimEndpoint:
    return SimEndpoint(name, window=WINDOW, kv_pool=POOL, fault=fault, flavour="llamacpp", **extra)


PROXIED = [
    proxied("healthy", FaultMode.HEALTHY),
    proxied("stale", FaultMode.STALE_KV),
    proxied("head", FaultMode.TRUNCATE_HEAD),
    proxied("head-lying", FaultMode.TRUNCATE_HEAD, report_usage="sent"),
    proxied("tail", FaultMode.TRUNCATE_TAIL),
    proxied("over-ok", FaultMode.ACCEPT_OVER_LIMIT),
    proxied("frame", FaultMode.STREAM_ERROR_FRAME),
    proxied("status", FaultMode.WRONG_STATUS),
    proxied("batch", FaultMode.BATCH_MIX, batch_mix_at=3),
    proxied("collides", FaultMode.PREFIX_COLLISION),
]


@dataclass
class Rig:
    upstream: RunningSimulator
    proxy: RunningProxy
    targets: dict[str, Target]
    runner: ProbeRunner


@pytest.fixture
async def rig(store: Store) -> AsyncIterator[Rig]:
    upstream_spec = SimEndpoint("engine", window=WINDOW, flavour="llamacpp")
    async with (
        run_simulator([upstream_spec]) as upstream,
        run_proxy(upstream.root_url_for("engine"), PROXIED) as proxy,
        httpx.AsyncClient(timeout=30) as client,
    ):
        entries = [sim_endpoint_entry(proxy, ep.name, flavour="llamacpp") for ep in PROXIED]
        config = config_for(entries, database="sqlite:///unused.db", defaults={"confirm": False})
        targets, runner, _metrics = targets_and_runner(config, store, client)
        yield Rig(upstream, proxy, targets, runner)


CASES = [
    ("healthy", UNDER, Verdict.PASS),
    ("healthy", OVER, Verdict.PASS),
    ("healthy", BASE, Verdict.PASS),
    ("stale", UNDER, Verdict.TRUNCATED),
    ("head", UNDER, Verdict.TRUNCATED),
    ("head-lying", UNDER, Verdict.MARKER_MISSING),
    ("tail", UNDER, Verdict.TRUNCATED),
    ("over-ok", OVER, Verdict.OVER_ACCEPTED),
    ("frame", UNDER, Verdict.STREAM_ERROR),
    ("status", OVER, Verdict.WRONG_REJECTION),
    ("healthy", ProbeKind.BURST, Verdict.PASS),
    ("batch", ProbeKind.BURST, Verdict.BURST_LEAK),
]


@pytest.mark.parametrize(("endpoint", "kind", "verdict"), CASES)
async def test_each_proxied_fault_yields_its_verdict(
    rig: Rig, endpoint: str, kind: ProbeKind, verdict: Verdict
) -> None:
    """kvwatch probing through the proxy sees each injected fault as DESIGN §2 names it."""
    report = await rig.runner.run(rig.targets[endpoint], kind)
    assert report.verdict is verdict, report.reason


async def test_stale_kv_serves_the_previous_prompt_so_its_marker_leaks(rig: Rig) -> None:
    """The upstream answers an earlier probe's prompt: the under probe carries its marker."""
    baseline = await rig.runner.run(rig.targets["stale"], BASE)
    assert baseline.verdict is Verdict.PASS, baseline.reason
    under = await rig.runner.run(rig.targets["stale"], UNDER)
    assert under.verdict is Verdict.FOREIGN_MARKER, under.reason
    assert [f.probe_id for f in under.foreign] == [baseline.probe_id]
    assert under.reported_prompt_tokens == 1


async def test_a_truncated_prompt_reports_what_the_upstream_read(rig: Rig) -> None:
    """truncate_tail keeps the head: about kv_pool tokens read, the marker still there."""
    report = await rig.runner.run(rig.targets["tail"], UNDER)
    assert report.verdict is Verdict.TRUNCATED
    assert report.marker_found
    assert report.reported_prompt_tokens is not None
    assert abs(report.reported_prompt_tokens - POOL) <= 2
    assert rig.proxy.stats()["tail"]["injected"] == 1


async def test_healthy_requests_and_engine_routes_pass_through_unchanged(rig: Rig) -> None:
    """tokenize, apply-template, props, models and health answer as the upstream does."""
    async with httpx.AsyncClient(timeout=10) as client:
        for method, path, body in [
            ("POST", "/tokenize", {"content": "Hello there, world", "with_pieces": True}),
            ("POST", "/apply-template", {"messages": [{"role": "user", "content": "Hi"}]}),
            ("GET", "/props", None),
            ("GET", "/v1/models", None),
            ("GET", "/health", None),
        ]:
            direct = await client.request(
                method, rig.upstream.root_url_for("engine") + path, json=body
            )
            via = await client.request(method, f"{rig.proxy.base_url}/healthy{path}", json=body)
            assert via.status_code == direct.status_code == 200, path
            if path != "/v1/models":  # the model card carries a fresh "created" time
                assert via.json() == direct.json(), path


@pytest.mark.parametrize("name", ["healthy", "head"])
async def test_the_upstream_engine_receives_the_probes_trace_id(
    rig: Rig, store: Store, name: str
) -> None:
    """Every request the proxy sends upstream for a probe, its own prompt counting and the
    cut prompt included, carries the traceparent of the trace id stored with the probe."""
    report = await rig.runner.run(rig.targets[name], UNDER)
    assert report.probe_id is not None
    row = get_probe(store, report.probe_id)
    assert row is not None and row.trace_id is not None
    received = rig.upstream.traces("engine")
    assert "/v1/chat/completions" in {r.path for r in received}
    traces = {r.headers.get("traceparent", "").split("-")[1:2] == [row.trace_id] for r in received}
    assert traces == {True}, [r.headers for r in received]


async def test_a_non_streamed_stream_error_fault_is_a_500(rig: Rig) -> None:
    """Without a stream there is no frame to fail in: the proxy answers 500 at once."""
    text = "word " * (POOL + 10)
    async with httpx.AsyncClient(timeout=10) as client:
        reply = await client.post(
            f"{rig.proxy.url_for('frame')}/chat/completions",
            json={"messages": [{"role": "user", "content": text}], "max_tokens": 8},
        )
    assert reply.status_code == 500
    assert "KV cache exhausted" in reply.json()["error"]["message"]


async def test_the_fault_can_be_switched_while_running(rig: Rig) -> None:
    """PUT /NAME/_sim/fault changes the fault; one with no proxy equivalent is refused."""
    async with httpx.AsyncClient(timeout=10) as client:
        url = f"{rig.proxy.base_url}/healthy/_sim/fault"
        ok = await client.put(url, json={"fault": "wrong_status"})
        refused = await client.put(url, json={"fault": "no_recall"})
    assert ok.status_code == 200
    assert refused.status_code == 400
    report = await rig.runner.run(rig.targets["healthy"], OVER)
    assert report.verdict is Verdict.WRONG_REJECTION


async def test_faults_a_real_model_cannot_act_out_are_refused_at_start() -> None:
    """no_recall, throttled, server_error and window_not_served have no proxy equivalent."""
    unsupported = [f for f in FaultMode if f not in PROXY_FAULTS]
    assert {f.value for f in unsupported} == {
        "no_recall",
        "throttled",
        "server_error",
        "window_not_served",
    }
    for fault in unsupported:
        with pytest.raises(ValueError, match="not available in proxy mode"):
            async with run_proxy("http://127.0.0.1:9", [SimEndpoint("x", fault=fault)]):
                pass


def test_the_command_refuses_proxy_mode_without_endpoints_or_with_a_simulator_only_fault() -> None:
    """--proxy needs --endpoint, and each endpoint's fault must have a proxy equivalent."""
    alone = CliRunner().invoke(simulate, ["--proxy", "http://127.0.0.1:9"])
    assert alone.exit_code == 2
    assert "--proxy needs --endpoint" in alone.output
    weak = CliRunner().invoke(
        simulate,
        [
            "--proxy",
            "http://127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
            "--endpoint",
            "name=x,fault=no_recall",
        ],
    )
    assert weak.exit_code == 2
    assert "fault no_recall is not available in proxy mode" in weak.output


async def test_serve_with_a_proxy_url_forwards_each_endpoint_to_the_engine() -> None:
    """The simulate command's server in proxy mode: endpoint URLs printed, requests forwarded."""
    lines: list[str] = []
    stop, ready = asyncio.Event(), asyncio.Event()

    def echo(line: str) -> None:
        lines.append(line)
        if line.startswith("stats:"):
            ready.set()

    endpoint = SimEndpoint("x", window=2048, kv_pool=1536, fault=FaultMode.STALE_KV)
    async with run_simulator([SimEndpoint("engine", window=2048, flavour="llamacpp")]) as up:
        task = asyncio.create_task(
            serve([endpoint], "127.0.0.1", 0, echo, stop, proxy=up.root_url_for("engine"))
        )
        await asyncio.wait_for(ready.wait(), timeout=10)
        assert lines[0].startswith(f"kvwatch proxy to {up.root_url_for('engine')} on http://")
        url = lines[1].split()[1]
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/x/v1", url)
        async with httpx.AsyncClient(timeout=10) as client:
            props = await client.get(url.removesuffix("/v1") + "/props")
        stop.set()
        await task
    assert props.status_code == 200
    assert props.json()["default_generation_settings"]["n_ctx"] == 2048


async def test_batch_mix_answers_each_burst_request_from_the_next_ones_prompt(rig: Rig) -> None:
    """Three at once through batch_mix: each answer is the upstream's answer to the next
    request's prompt, so each holds the next request's marker; the solo request is left
    alone."""
    report = await rig.runner.run(rig.targets["batch"], ProbeKind.BURST)
    row = get_probe(rig.runner.store, report.probe_id)
    assert row is not None
    assert [r.siblings for r in row.burst] == [(), (2,), (3,), (1,)]
    assert rig.proxy.stats()["batch"]["injected"] == 3


async def test_batch_mix_that_mixes_one_answer_into_another_is_refused_in_proxy_mode() -> None:
    """mix has no real-model equivalent: the proxy refuses it at start, naming swap."""
    endpoint = SimEndpoint("x", fault=FaultMode.BATCH_MIX, batch_mix_how="mix")
    with pytest.raises(ValueError, match="batch_mix_how mix is not available in proxy mode"):
        async with run_proxy("http://127.0.0.1:9", [endpoint]):
            pass


async def test_prefix_collision_answers_the_cache_probe_from_the_earlier_document(rig: Rig) -> None:
    """The proxy serves earlier text past where A' departs from A: the upstream answers the
    branch with another planted code; the control (no shared prefix) is right:
    cache_corrupt."""
    report = await rig.runner.run(rig.targets["collides"], ProbeKind.CACHE)
    assert report.verdict is Verdict.CACHE_CORRUPT, report.reason
    row = get_probe(rig.runner.store, report.probe_id)
    assert row is not None
    steps = {s.step: s for s in row.cache}
    assert steps["cold"].outcome.value == "right"
    # Which earlier code it gives depends on where the blocks fall: always another one.
    assert steps["branch"].outcome.value == "wrong" and steps["branch"].answered
    assert steps["control"].outcome.value == "right"
    assert rig.proxy.stats()["collides"]["injected"] >= 1


@pytest.fixture
async def paced_rig(store: Store) -> AsyncIterator[Rig]:
    """abort_reuse through the proxy, in front of an engine that decodes a token every
    20 ms, as real ones do a step at a time: a client's hang-up lands mid-answer."""
    upstream_spec = SimEndpoint(
        "engine", window=WINDOW, flavour="llamacpp", decode_tokens_per_second=50
    )
    aborts = [proxied("aborts", FaultMode.ABORT_REUSE)]
    async with (
        run_simulator([upstream_spec]) as upstream,
        run_proxy(upstream.root_url_for("engine"), aborts) as proxy,
        httpx.AsyncClient(timeout=30) as client,
    ):
        entries = [sim_endpoint_entry(proxy, "aborts", flavour="llamacpp")]
        config = config_for(entries, database="sqlite:///unused.db", defaults={"confirm": False})
        targets, runner, _metrics = targets_and_runner(config, store, client)
        yield Rig(upstream, proxy, targets, runner)


async def test_abort_reuse_answers_the_reuse_from_the_aborted_requests_half_filled_pages(
    paced_rig: Rig,
) -> None:
    """The abort step hangs up mid-answer: its later blocks stay empty, so the reuse of that
    document is forwarded without its late fact and answered wrong; cold, warm and branch,
    whose answers went out whole, are right: cache_corrupt."""
    report = await paced_rig.runner.run(paced_rig.targets["aborts"], ProbeKind.CACHE)
    assert report.verdict is Verdict.CACHE_CORRUPT, report.reason
    row = get_probe(paced_rig.runner.store, report.probe_id)
    assert row is not None
    steps = {s.step: s for s in row.cache}
    assert [steps[s].outcome.value for s in ("cold", "warm", "branch")] == ["right"] * 3
    assert steps["reuse"].outcome.value == "wrong"
    # Only the reuse was served other text than it sent.
    assert paced_rig.proxy.stats()["aborts"]["injected"] == 1


async def test_abort_reuse_leaves_a_stream_read_to_its_end_whole_in_the_cache(
    paced_rig: Rig,
) -> None:
    """A streamed answer relayed whole completes its blocks: the same prompt again is
    forwarded as sent."""
    url = paced_rig.proxy.url_for("aborts") + "/chat/completions"
    document = " ".join(f"word{i}" for i in range(400))
    body = {"messages": [{"role": "user", "content": document}], "max_tokens": 4}
    async with httpx.AsyncClient(timeout=30) as client:
        first = await client.post(url, json=body | {"stream": True})
        assert first.status_code == 200 and "[DONE]" in first.text
        again = await client.post(url, json=body)
        assert again.status_code == 200
    assert paced_rig.proxy.stats()["aborts"]["injected"] == 0
