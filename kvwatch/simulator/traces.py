"""The trace headers each simulated endpoint received, for tests to compare with kvwatch's.

kvwatch stores the trace id of each probe and sends it on every request the probe makes; an
engine that reads it (vLLM with OpenTelemetry, llm-d, KServe) starts its spans under it. The
simulator keeps, per endpoint, the latest requests' trace headers (``traceparent``,
``tracestate``, ``b3``) with their path, so a test can check that what was stored is what
arrived: up to :data:`KEPT` per endpoint, and :data:`KEPT_TOTAL` across a simulator's
endpoints (:func:`kept_per_endpoint`), so a fleet of a thousand keeps a few megabytes.
Recorded by an ASGI middleware in front of every route, so no route can forget it;
``GET /_sim/traces`` serves them to tests that run the simulator in another process.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

TRACE_HEADERS = ("traceparent", "tracestate", "b3")
# Enough for every request of a test's probes; a long game day keeps only the latest.
KEPT = 1000
# The bound across all endpoints (about 430 bytes a record): a 1,020-endpoint fleet kept
# 1,000 each, 440 MB, and two such simulators took more than a core after an hour and a half
# at 50 probes/s each (bench memory, issue 25).
KEPT_TOTAL = 16 * KEPT
# The fewest kept per endpoint however large the fleet: a probe's own requests.
KEPT_MIN = 16


def kept_per_endpoint(endpoints: int) -> int:
    """How many requests' headers each of ``endpoints`` keeps: :data:`KEPT` for a test's few
    endpoints, fewer for a fleet, so that all of them keep about :data:`KEPT_TOTAL`."""
    return max(KEPT_MIN, min(KEPT, KEPT_TOTAL // max(1, endpoints)))


@dataclass(frozen=True, slots=True)
class ReceivedTrace:
    """One request's trace headers (lower-case names; absent ones left out)."""

    path: str  # below the endpoint: "/v1/chat/completions", "/tokenize", ...
    headers: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "headers": self.headers}


class ReceivedTraces:
    """Per endpoint name, the trace headers of its latest requests, oldest first."""

    def __init__(self, per_endpoint: int = KEPT) -> None:
        if per_endpoint < 1:
            raise ValueError(f"traces kept per endpoint must be at least 1, got {per_endpoint}")
        self.per_endpoint = per_endpoint
        self._by_endpoint: dict[str, deque[ReceivedTrace]] = {}

    def record(self, endpoint: str, path: str, headers: dict[str, str]) -> None:
        kept = self._by_endpoint.get(endpoint)
        if kept is None:  # not setdefault: that would build a deque on every request
            kept = self._by_endpoint[endpoint] = deque(maxlen=self.per_endpoint)
        kept.append(ReceivedTrace(path, headers))

    def of(self, endpoint: str) -> list[ReceivedTrace]:
        return list(self._by_endpoint.get(endpoint, ()))

    def as_dict(self) -> dict[str, list[dict[str, Any]]]:
        return {name: [t.as_dict() for t in kept] for name, kept in self._by_endpoint.items()}


class RecordTraces:
    """ASGI middleware: note the trace headers of every request to ``/NAME/...`` for a
    ``NAME`` in ``endpoints``, before the route (or its 401) answers."""

    def __init__(self, app: ASGIApp, traces: ReceivedTraces, endpoints: frozenset[str]) -> None:
        self.app = app
        self.traces = traces
        self.endpoints = endpoints

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            name, _, rest = str(scope["path"]).lstrip("/").partition("/")
            if name in self.endpoints:
                found = {
                    key.decode("latin-1").lower(): value.decode("latin-1")
                    for key, value in scope["headers"]
                    if key.decode("latin-1").lower() in TRACE_HEADERS
                }
                self.traces.record(name, "/" + rest, found)
        await self.app(scope, receive, send)


def traces_route(traces: ReceivedTraces) -> Any:
    async def received(_request: Request) -> Response:
        return JSONResponse(traces.as_dict())

    return received
