"""Trace context headers: their exact format, one trace per probe, one span per request."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from kvwatch.engines.tracing import (
    TraceFormat,
    TraceSettings,
    current_trace,
    header_value,
    instrument,
    new_span_id,
    new_trace_id,
    probe_trace,
)

TRACE, SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
# W3C Trace Context level 1, §3.2: version 00, 32 and 16 lower-case hex digits, flags.
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-01")
B3 = re.compile(r"([0-9a-f]{32})-([0-9a-f]{16})-1")


def test_w3c_is_version_00_trace_span_and_the_sampled_flag() -> None:
    """traceparent: 00-{trace id}-{span id}-01, the W3C specification's own example."""
    assert header_value(TraceFormat.W3C, TRACE, SPAN) == f"00-{TRACE}-{SPAN}-01"


def test_b3_single_header_is_trace_span_and_sampled() -> None:
    """b3: {trace id}-{span id}-1 (Zipkin's single-header form, sampled)."""
    assert header_value(TraceFormat.B3, TRACE, SPAN) == f"{TRACE}-{SPAN}-1"


def test_off_has_no_header_value() -> None:
    """Asking for the value of format off is a programming error, said so."""
    with pytest.raises(ValueError, match="sends no header"):
        header_value(TraceFormat.OFF, TRACE, SPAN)


def test_ids_are_random_lower_case_hex_of_16_and_8_bytes() -> None:
    """Trace ids are 32 hex digits, span ids 16; no two drawn alike, none all zero."""
    traces = {new_trace_id() for _ in range(200)}
    spans = {new_span_id() for _ in range(200)}
    assert len(traces) == len(spans) == 200
    assert all(re.fullmatch(r"[0-9a-f]{32}", t) and set(t) != {"0"} for t in traces)
    assert all(re.fullmatch(r"[0-9a-f]{16}", s) and set(s) != {"0"} for s in spans)


def test_each_format_goes_in_its_own_header_unless_one_is_named() -> None:
    """traceparent for w3c, b3 for b3, the configured name when given, none when off."""
    assert TraceSettings().header_name == "traceparent"
    assert TraceSettings(TraceFormat.B3).header_name == "b3"
    assert TraceSettings(TraceFormat.W3C, "x-trace").header_name == "x-trace"
    assert TraceSettings(TraceFormat.OFF).header_name is None


def recording_client(seen: list[httpx.Headers]) -> httpx.AsyncClient:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers)
        return httpx.Response(200, json={})

    return instrument(httpx.AsyncClient(transport=httpx.MockTransport(answer)))


async def test_every_request_of_a_probe_shares_its_trace_with_a_span_of_its_own() -> None:
    """Three requests in one probe trace: one trace id (the probe's), three span ids."""
    seen: list[httpx.Headers] = []
    async with recording_client(seen) as client:
        with probe_trace(TraceSettings()) as trace:
            assert trace is not None and current_trace() is trace
            await client.get("http://engine/v1/models")
            await client.post("http://engine/tokenize", json={})
            await client.post("http://engine/v1/chat/completions", json={})
    parsed = [TRACEPARENT.fullmatch(h["traceparent"]) for h in seen]
    assert all(parsed)
    assert {m.group(1) for m in parsed if m} == {trace.trace_id}
    assert len({m.group(2) for m in parsed if m}) == 3


async def test_two_probes_at_once_keep_their_own_traces() -> None:
    """Concurrent probes on one shared client never see each other's trace id."""
    seen: list[httpx.Headers] = []
    async with recording_client(seen) as client:

        async def probe(path: str) -> str:
            with probe_trace(TraceSettings()) as trace:
                assert trace is not None
                for _ in range(3):
                    await client.get(f"http://engine/{path}")
                    await asyncio.sleep(0)
                return trace.trace_id

        first, second = await asyncio.gather(probe("a"), probe("b"))
    by_trace = {TRACEPARENT.fullmatch(h["traceparent"]).group(1) for h in seen}  # type: ignore[union-attr]
    assert first != second and by_trace == {first, second}
    assert sum(first in h["traceparent"] for h in seen) == 3


async def test_b3_and_a_named_header_carry_the_same_trace() -> None:
    """format b3 writes `b3`; a configured header name carries the chosen format."""
    seen: list[httpx.Headers] = []
    async with recording_client(seen) as client:
        with probe_trace(TraceSettings(TraceFormat.B3)) as b3:
            await client.get("http://engine/")
        with probe_trace(TraceSettings(TraceFormat.W3C, "x-kvwatch-trace")) as named:
            await client.get("http://engine/")
    assert b3 is not None and named is not None
    match = B3.fullmatch(seen[0]["b3"])
    assert match is not None and match.group(1) == b3.trace_id
    assert "traceparent" not in seen[0]
    named_match = TRACEPARENT.fullmatch(seen[1]["x-kvwatch-trace"])
    assert named_match is not None and named_match.group(1) == named.trace_id
    assert "traceparent" not in seen[1]


async def test_no_header_outside_a_probe_or_with_tracing_off() -> None:
    """Requests made outside a probe, or in a probe with format off, carry no trace."""
    seen: list[httpx.Headers] = []
    async with recording_client(seen) as client:
        await client.get("http://engine/")
        with probe_trace(TraceSettings(TraceFormat.OFF)) as trace:
            assert trace is None
            await client.get("http://engine/")
    assert [("traceparent" in h, "b3" in h) for h in seen] == [(False, False)] * 2


async def test_instrumenting_a_client_twice_adds_the_hook_once() -> None:
    """endpoint_engines instruments the shared client per endpoint: one header, not two."""
    seen: list[httpx.Headers] = []
    async with recording_client(seen) as client:
        instrument(instrument(client))
        assert len(client.event_hooks["request"]) == 1
        with probe_trace(TraceSettings()):
            await client.get("http://engine/")
    assert len(seen[0].get_list("traceparent")) == 1
