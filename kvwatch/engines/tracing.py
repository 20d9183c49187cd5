"""Trace context on every request a probe makes, so a failed canary links to the server's span.

One trace per probe: :func:`probe_trace` draws a trace id and makes it the current one for
everything the probe awaits (discovery, tokenize, the completion, in whichever adapter).
:func:`instrument` puts :func:`_stamp` on an engine's HTTP client as a request hook, which
gives each request of the current trace a span id of its own and writes the header. Requests
made outside a probe (``check-config --live``, the web UI) carry none.

Formats:

- ``w3c``: ``traceparent: 00-{trace id}-{span id}-01`` (W3C Trace Context level 1, version
  00, sampled), what vLLM's OpenTelemetry tracing (``--otlp-traces-endpoint``), llm-d and
  KServe read;
- ``b3``: Zipkin's single header, ``b3: {trace id}-{span id}-1`` (sampled), for meshes and
  gateways that speak B3 only;
- ``off``: nothing is sent and no trace id is stored.

The ids come from :func:`secrets.token_hex`: W3C asks for random trace ids (an all-zero id
is invalid, and 2⁻¹²⁸ is not worth a retry loop).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from enum import StrEnum

import httpx


class TraceFormat(StrEnum):
    W3C = "w3c"
    B3 = "b3"
    OFF = "off"


# The header each format is read from, unless the configuration names another.
DEFAULT_HEADERS = {TraceFormat.W3C: "traceparent", TraceFormat.B3: "b3"}


@dataclass(frozen=True, slots=True)
class TraceSettings:
    """How probes carry their trace: the format, and the header it goes in."""

    format: TraceFormat = TraceFormat.W3C
    header: str | None = None  # None: the format's own (traceparent, b3)

    @property
    def header_name(self) -> str | None:
        if self.format is TraceFormat.OFF:
            return None
        return self.header or DEFAULT_HEADERS[self.format]


@dataclass(frozen=True, slots=True)
class ProbeTrace:
    """The trace of one probe: its id, and where and how each request carries it."""

    trace_id: str  # 32 lower-case hex digits
    header: str
    format: TraceFormat


def new_trace_id() -> str:
    return secrets.token_hex(16)


def new_span_id() -> str:
    return secrets.token_hex(8)


def header_value(fmt: TraceFormat, trace_id: str, span_id: str) -> str:
    """The header's value for one request (span) of the trace ``trace_id``."""
    if fmt is TraceFormat.W3C:
        return f"00-{trace_id}-{span_id}-01"
    if fmt is TraceFormat.B3:
        return f"{trace_id}-{span_id}-1"
    raise ValueError(f"trace format {fmt.value!r} sends no header")


_current: ContextVar[ProbeTrace | None] = ContextVar("kvwatch_probe_trace", default=None)


@contextlib.contextmanager
def probe_trace(settings: TraceSettings) -> Iterator[ProbeTrace | None]:
    """A new trace, current for the block (and the tasks it starts); None when ``off``."""
    header = settings.header_name
    if header is None:
        yield None
        return
    trace = ProbeTrace(new_trace_id(), header, settings.format)
    token = _current.set(trace)
    try:
        yield trace
    finally:
        _current.reset(token)


def current_trace() -> ProbeTrace | None:
    return _current.get()


async def _stamp(request: httpx.Request) -> None:
    trace = _current.get()
    if trace is not None:
        request.headers[trace.header] = header_value(trace.format, trace.trace_id, new_span_id())


def instrument(client: httpx.AsyncClient) -> httpx.AsyncClient:
    """Give ``client`` the request hook that carries the current probe's trace (once)."""
    hooks = client.event_hooks
    if _stamp not in hooks["request"]:
        hooks["request"] = [*hooks["request"], _stamp]
        client.event_hooks = hooks
    return client
