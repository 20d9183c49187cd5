"""The simulator notes the trace headers each endpoint receives, for tests to compare."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvwatch.simulator.spec import SimEndpoint

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
