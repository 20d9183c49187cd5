"""The simulator notes the trace headers each endpoint receives, for tests to compare."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvwatch.simulator.model import Simulation
from kvwatch.simulator.spec import SimEndpoint
from kvwatch.simulator.traces import KEPT, KEPT_MIN, KEPT_TOTAL, ReceivedTraces, kept_per_endpoint

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_each_request_is_recorded_with_its_path_and_trace_headers_only(
    start: Callable[..., Any],
) -> None:
    """traceparent, tracestate and b3 are kept per endpoint and path; other headers are not."""
    sim, client = await start([SimEndpoint("a"), SimEndpoint("b")])
    await client.get(
        "/a/v1/models",
        headers={"traceparent": TRACEPARENT, "tracestate": "k=v", "authorization": "Bearer x"},
    )
    await client.post("/b/tokenize", json={"prompt": "hi"}, headers={"b3": "abc-def-1"})
    await client.get("/a/health")
    assert [(t.path, t.headers) for t in sim.traces("a")] == [
        ("/v1/models", {"traceparent": TRACEPARENT, "tracestate": "k=v"}),
        ("/health", {}),
    ]
    assert [(t.path, t.headers) for t in sim.traces("b")] == [("/tokenize", {"b3": "abc-def-1"})]


async def test_a_refused_request_is_recorded_too(start: Callable[..., Any]) -> None:
    """A 401 still arrived with its trace: the record is taken before any route answers."""
    sim, client = await start([SimEndpoint("locked", api_key="sk-right")])
    reply = await client.post(
        "/locked/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}]},
        headers={"traceparent": TRACEPARENT, "authorization": "Bearer sk-wrong"},
    )
    assert reply.status_code == 401
    assert [t.headers for t in sim.traces("locked")] == [{"traceparent": TRACEPARENT}]


async def test_the_control_api_serves_the_records_and_skips_its_own_routes(
    start: Callable[..., Any],
) -> None:
    """GET /_sim/traces: every endpoint's records as JSON; /_sim/ and unknown names add none."""
    _sim, client = await start([SimEndpoint("a")])
    await client.get("/a/v1/models", headers={"traceparent": TRACEPARENT})
    await client.get("/_sim/stats", headers={"traceparent": TRACEPARENT})
    await client.get("/nobody/v1/models", headers={"traceparent": TRACEPARENT})
    reply = await client.get("/_sim/traces")
    assert reply.json() == {"a": [{"path": "/v1/models", "headers": {"traceparent": TRACEPARENT}}]}


def test_a_test_sized_simulator_keeps_a_thousand_records_per_endpoint() -> None:
    """A few endpoints keep KEPT each: every request of a test's probes stays inspectable."""
    assert kept_per_endpoint(1) == KEPT
    assert kept_per_endpoint(16) == KEPT


def test_a_fleet_keeps_about_the_total_bound_across_its_endpoints() -> None:
    """1,020 endpoints keep KEPT_MIN each, not 1,000 each (440 MB of records)."""
    assert kept_per_endpoint(100) == KEPT_TOTAL // 100
    assert kept_per_endpoint(1020) == KEPT_MIN
    assert kept_per_endpoint(1020) * 1020 < KEPT * 1020 // 50


def test_an_endpoint_keeps_only_its_latest_records_oldest_out_first() -> None:
    """Past the bound the oldest record goes; other endpoints keep theirs."""
    traces = ReceivedTraces(per_endpoint=2)
    for path in ("/one", "/two", "/three"):
        traces.record("a", path, {})
    traces.record("b", "/only", {})
    assert [t.path for t in traces.of("a")] == ["/two", "/three"]
    assert [t.path for t in traces.of("b")] == ["/only"]


def test_a_bound_below_one_is_refused_with_its_value() -> None:
    """A bound of 0 would keep nothing and read as 'no request arrived'."""
    with pytest.raises(ValueError, match="at least 1, got 0"):
        ReceivedTraces(per_endpoint=0)


def test_a_fleet_simulation_sizes_its_records_by_its_endpoints() -> None:
    """Simulation passes its own size to the bound."""
    sim = Simulation([SimEndpoint(f"e{i}") for i in range(200)])
    assert sim.traces.per_endpoint == KEPT_TOTAL // 200
