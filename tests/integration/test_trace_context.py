"""Trace context end to end: what the simulator received is what kvwatch stored and logged.

Real HTTP to kvwatch's simulator, the daemon's own wiring (``build``: per-endpoint clients,
the runner's trace settings from ``trace:``), the real store on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from structlog.testing import capture_logs

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.config import load_config
from kvwatch.daemon import Built, Daemon, build
from kvwatch.simulator.server import RunningSimulator, run_simulator
from kvwatch.simulator.spec import SimEndpoint
from kvwatch.simulator.traces import ReceivedTrace
from tests.helpers.alertmanager import free_port
from tests.helpers.store import get_probe
from tests.helpers.targets import config_for, sim_endpoint_entry

TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-01")
B3 = re.compile(r"([0-9a-f]{32})-([0-9a-f]{16})-1")
FLEET = [SimEndpoint("traced", window=8192, kv_pool=8192, flavour="vllm")]


async def running(sim: RunningSimulator, db_url: str, **top: Any) -> Built:
    # No context_window: the under probe discovers it (GET /v1/models) and counts its
    # prompt (POST /tokenize) before the canary, so all three kinds of request are traced.
    entry = sim_endpoint_entry(sim, "traced", flavour="vllm", context_window=None)
    return await build(config_for([entry], database=db_url, **top))


@pytest.fixture
async def sim() -> AsyncIterator[RunningSimulator]:
    async with run_simulator(FLEET) as running_sim:
        yield running_sim


def ids(received: list[ReceivedTrace], header: str, form: re.Pattern[str]) -> list[re.Match[str]]:
    matches = [form.fullmatch(r.headers.get(header, "")) for r in received]
    assert all(matches), [r.headers for r in received]
    return [m for m in matches if m is not None]


async def test_every_request_of_a_probe_carries_the_stored_trace_id(
    sim: RunningSimulator, db_url: str
) -> None:
    """Discovery, tokenize and the canary each arrive with traceparent 00-{stored id}-{own
    span}-01; the probe log line names the same id; the next probe has a trace of its own."""
    built = await running(sim, db_url)
    try:
        target = built.targets[0]
        with capture_logs() as logs:
            (under,) = await built.runner.run_checked(target, ProbeKind.UNDER)
        assert under.verdict is Verdict.PASS and under.probe_id is not None
        received = sim.traces("traced")
        paths = {r.path for r in received}
        assert {"/v1/models", "/tokenize", "/v1/chat/completions"} <= paths, paths
        row = get_probe(built.store, under.probe_id)
        assert row is not None and row.trace_id is not None
        matches = ids(received, "traceparent", TRACEPARENT)
        assert {m.group(1) for m in matches} == {row.trace_id} == {under.trace_id}
        assert len({m.group(2) for m in matches}) == len(received)
        (line,) = [e for e in logs if e["event"] == "probe"]
        assert line["trace_id"] == row.trace_id

        (baseline,) = await built.runner.run_checked(target, ProbeKind.BASELINE)
        assert baseline.probe_id is not None
        later = sim.traces("traced")[len(received) :]
        stored = get_probe(built.store, baseline.probe_id)
        assert stored is not None and stored.trace_id not in (None, row.trace_id)
        assert {m.group(1) for m in ids(later, "traceparent", TRACEPARENT)} == {stored.trace_id}
    finally:
        await built.clients.aclose()
        built.store.engine.dispose()


async def test_b3_sends_the_single_b3_header_with_the_stored_trace_id(
    sim: RunningSimulator, db_url: str
) -> None:
    """trace: {format: b3}: every request carries b3 {stored id}-{span}-1 and no traceparent."""
    built = await running(sim, db_url, trace={"format": "b3"})
    try:
        (under,) = await built.runner.run_checked(built.targets[0], ProbeKind.UNDER)
        assert under.probe_id is not None
        row = get_probe(built.store, under.probe_id)
        received = sim.traces("traced")
        assert row is not None and received
        assert {m.group(1) for m in ids(received, "b3", B3)} == {row.trace_id}
        assert not any("traceparent" in r.headers for r in received)
    finally:
        await built.clients.aclose()
        built.store.engine.dispose()


async def test_with_tracing_off_nothing_is_sent_and_no_id_is_stored(
    sim: RunningSimulator, db_url: str
) -> None:
    """trace: {format: off}: no trace header reaches the engine, the row's trace_id is null."""
    built = await running(sim, db_url, trace={"format": "off"})
    try:
        (under,) = await built.runner.run_checked(built.targets[0], ProbeKind.UNDER)
        assert under.probe_id is not None and under.trace_id is None
        row = get_probe(built.store, under.probe_id)
        assert row is not None and row.trace_id is None
        received = sim.traces("traced")
        assert received and all(r.headers == {} for r in received)
    finally:
        await built.clients.aclose()
        built.store.engine.dispose()


async def test_a_reload_changes_the_trace_format_of_the_next_probe(
    sim: RunningSimulator, db_url: str, tmp_path: Path
) -> None:
    """The daemon's SIGHUP path: `trace: {format: off}` written and reloaded, the next probe
    carries and stores no trace; the one before it did."""
    entry = sim_endpoint_entry(sim, "traced", interval="1h", probes=["baseline"])
    doc = {"database": db_url, "listen": f"127.0.0.1:{free_port()}", "endpoints": [entry]}
    path = tmp_path / "kvwatch.yaml"
    path.write_text(yaml.safe_dump(doc))
    daemon = Daemon(load_config(path), config_path=path, grace_seconds=1)
    running_daemon = asyncio.create_task(daemon.run())
    try:
        while daemon._built is None:
            assert not running_daemon.done(), running_daemon
            await asyncio.sleep(0.05)
        built = daemon._built
        before = await built.runner.run(built.targets[0], ProbeKind.BASELINE)
        path.write_text(yaml.safe_dump(doc | {"trace": {"format": "off"}}))
        ok, message = await daemon.reload()
        assert ok, message
        after = await built.runner.run(built.targets[0], ProbeKind.BASELINE)
        stored = [get_probe(built.store, r.probe_id) for r in (before, after) if r.probe_id]
        assert [row.trace_id is not None for row in stored if row] == [True, False]
    finally:
        daemon.stop.set()
        await running_daemon
