"""OpenAIEngine.chat against the simulator over HTTP, and against broken peers."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from kvwatch.canary.markers import contains_marker
from kvwatch.canary.model import Rejection, TransportError
from kvwatch.engines.openai import OpenAIEngine
from kvwatch.simulator import tokenizer
from kvwatch.simulator.model import render_chat
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import FaultMode, Flavour, SimEndpoint
from tests.engines.wire import canary_messages, read_request, tcp_peer


def _engine(client: httpx.AsyncClient, url: str, **kwargs: object) -> OpenAIEngine:
    kwargs.setdefault("model", "sim-1")
    kwargs.setdefault("api_key", None)
    return OpenAIEngine(client, base_url=url, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("stream", [False, True])
async def test_it_reads_the_answer_and_usage_of_a_healthy_endpoint(
    client: httpx.AsyncClient, marker: str, stream: bool
) -> None:
    """A 200 completion yields the answer, finish_reason and the engine's prompt count."""
    messages = canary_messages(marker)
    async with run_simulator([SimEndpoint("ok")]) as sim:
        engine = _engine(client, sim.url_for("ok"))
        ex = await engine.chat(messages, max_tokens=32, stream=stream, timeout=30)
    assert ex.status == 200
    assert ex.transport_error is None, ex.error_detail
    assert ex.body_parsed
    assert ex.answer is not None and contains_marker(ex.answer, marker)
    assert ex.finish_reason == "stop"
    assert ex.prompt_tokens == tokenizer.count(render_chat(messages))
    assert ex.completion_tokens is not None and ex.completion_tokens > 0
    assert ex.streamed is stream
    assert ex.stream_terminated is stream
    assert ex.ttfb_seconds is not None and ex.total_seconds is not None
    assert 0 <= ex.ttfb_seconds <= ex.total_seconds


# The flavours whose OpenAI chat API rejects with a 400; TGI's 422, Anthropic's and Ollama's
# native APIs are covered by tests/engines/test_engine_matrix.py.
@pytest.mark.parametrize(
    "flavour", [Flavour.VLLM, Flavour.LLAMACPP, Flavour.OPENAI, Flavour.SGLANG]
)
@pytest.mark.parametrize("stream", [False, True])
async def test_it_recognises_each_flavours_context_length_rejection(
    client: httpx.AsyncClient, marker: str, flavour: Flavour, stream: bool
) -> None:
    """An over-window prompt comes back 400 and is classified as a context-length rejection."""
    messages = canary_messages(marker, filler_words=200)
    async with run_simulator([SimEndpoint("small", window=256, flavour=flavour)]) as sim:
        ex = await _engine(client, sim.url_for("small")).chat(
            messages, max_tokens=16, stream=stream, timeout=30
        )
    assert ex.status == 400
    assert ex.rejection is Rejection.CONTEXT_LENGTH
    assert ex.error_body is not None and "context" in ex.error_body
    assert ex.error_detail is not None and ex.error_detail.startswith("HTTP 400: ")
    assert not ex.body_parsed


async def test_it_flags_an_error_frame_inside_a_200_stream(
    client: httpx.AsyncClient, marker: str
) -> None:
    """A stream that fails mid-way with an error frame is recorded as such, with its body."""
    spec = SimEndpoint("frame", window=4096, kv_pool=128, fault=FaultMode.STREAM_ERROR_FRAME)
    async with run_simulator([spec]) as sim:
        ex = await _engine(client, sim.url_for("frame")).chat(
            canary_messages(marker, filler_words=100), max_tokens=16, stream=True, timeout=30
        )
    assert ex.status == 200
    assert ex.stream_error_frame
    assert not ex.body_parsed
    assert ex.rejection is Rejection.OTHER  # "KV cache exhausted" is not a window rejection
    assert ex.error_body is not None and "KV cache exhausted" in ex.error_body
    assert ex.error_detail is not None and "error frame" in ex.error_detail


@pytest.mark.parametrize(
    ("fault", "status"), [(FaultMode.THROTTLED, 429), (FaultMode.SERVER_ERROR, 500)]
)
async def test_it_records_throttling_and_server_errors_with_their_bodies(
    client: httpx.AsyncClient, marker: str, fault: FaultMode, status: int
) -> None:
    """Non-2xx answers keep their status and a bounded error body, and are not rejections."""
    async with run_simulator([SimEndpoint("bad", fault=fault)]) as sim:
        ex = await _engine(client, sim.url_for("bad")).chat(
            canary_messages(marker), max_tokens=16, stream=False, timeout=30
        )
    assert ex.status == status
    assert ex.transport_error is None
    assert ex.rejection is Rejection.OTHER
    assert ex.error_body is not None and ex.error_body.startswith("{")


async def test_it_sends_the_api_key_only_as_a_bearer_header(
    client: httpx.AsyncClient, marker: str
) -> None:
    """Without the key the endpoint answers 401; with it, 200; the key never shows in detail."""
    secret = "sk-test-1234567890"
    async with run_simulator([SimEndpoint("auth", api_key=secret)]) as sim:
        url = sim.url_for("auth")
        refused = await _engine(client, url).chat(
            canary_messages(marker), max_tokens=16, stream=False, timeout=30
        )
        wrong = await _engine(client, url, api_key="sk-wrong").chat(
            canary_messages(marker), max_tokens=16, stream=False, timeout=30
        )
        accepted = await _engine(client, url, api_key=secret).chat(
            canary_messages(marker), max_tokens=16, stream=True, timeout=30
        )
    assert refused.status == 401
    assert wrong.status == 401
    assert "sk-wrong" not in (wrong.error_detail or "") + (wrong.error_body or "")
    assert accepted.status == 200 and accepted.body_parsed


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_a_closed_port_is_a_connect_error(client: httpx.AsyncClient, marker: str) -> None:
    """Nothing listening: CONNECT, no status, a one-line detail, and no exception."""
    engine = _engine(client, f"http://127.0.0.1:{_closed_port()}/v1", api_key="sk-secret")
    ex = await engine.chat(canary_messages(marker), max_tokens=16, stream=False, timeout=5)
    assert ex.status is None
    assert ex.transport_error is TransportError.CONNECT
    assert ex.error_detail is not None and "\n" not in ex.error_detail
    assert "sk-secret" not in ex.error_detail


async def test_a_peer_that_stalls_after_headers_hits_the_deadline(
    client: httpx.AsyncClient, marker: str
) -> None:
    """Headers then silence: the one overall deadline fires, TIMEOUT is recorded, and the
    progress callback ticked while waiting."""

    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n"
        )
        await writer.drain()
        await reader.read()  # until the client gives up and closes

    ticks: list[str] = []
    async with tcp_peer(stall) as url:
        engine = _engine(client, url, progress_interval=0.1)
        ex = await engine.chat(
            canary_messages(marker), max_tokens=16, stream=False, timeout=0.6, progress=ticks.append
        )
    assert ex.status == 200
    assert ex.transport_error is TransportError.TIMEOUT
    assert ex.error_detail == "timeout: no complete answer within the 0.6 s deadline"
    assert ex.total_seconds is not None and 0.55 < ex.total_seconds < 5
    assert ticks and all(t.startswith("waiting for first byte, ") for t in ticks)


async def test_a_peer_that_never_answers_times_out_without_a_status(
    client: httpx.AsyncClient, marker: str
) -> None:
    """A prefill that outlasts the deadline (no headers at all) is a TIMEOUT with no status."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await reader.read()

    async with tcp_peer(silent) as url:
        ex = await _engine(client, url).chat(
            canary_messages(marker), max_tokens=16, stream=True, timeout=0.3
        )
    assert ex.status is None
    assert ex.transport_error is TransportError.TIMEOUT
    assert not ex.stream_terminated


async def test_a_body_over_the_cap_is_too_large(client: httpx.AsyncClient, marker: str) -> None:
    """A 2xx body larger than body_limit_bytes stops the read with TOO_LARGE."""
    async with run_simulator([SimEndpoint("ok")]) as sim:
        engine = _engine(client, sim.url_for("ok"), body_limit_bytes=64)
        plain = await engine.chat(canary_messages(marker), max_tokens=16, stream=False, timeout=30)
        streamed = await engine.chat(
            canary_messages(marker), max_tokens=16, stream=True, timeout=30
        )
    for ex in (plain, streamed):
        assert ex.status == 200
        assert ex.transport_error is TransportError.TOO_LARGE
        assert not ex.body_parsed
        assert ex.error_detail is not None and "64-byte read cap" in ex.error_detail
    assert not streamed.stream_terminated


async def test_a_stream_cut_mid_way_is_unterminated_and_keeps_the_partial_answer(
    client: httpx.AsyncClient, marker: str
) -> None:
    """The connection drops inside the stream: READ, not terminated, partial text kept."""

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        frame = (
            b'data: {"choices":[{"index":0,"delta":{"content":"KVW-"},"finish_reason":null}]}\n\n'
        )
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
            + f"{len(frame):x}\r\n".encode()
            + frame
            + b"\r\n"
            + b'10\r\ndata: {"choi'  # half a chunk, then the peer vanishes
        )
        await writer.drain()

    async with tcp_peer(cut) as url:
        ex = await _engine(client, url).chat(
            canary_messages(marker), max_tokens=16, stream=True, timeout=5
        )
    assert ex.status == 200
    assert ex.transport_error is TransportError.READ
    assert not ex.stream_terminated
    assert ex.answer == "KVW-"


async def test_a_stream_that_ends_cleanly_without_done_is_unterminated(
    client: httpx.AsyncClient, marker: str
) -> None:
    """A well-formed HTTP stream that just stops before [DONE] is not a terminated stream."""

    async def no_done(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        body = (
            b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\n'
        )
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()

    async with tcp_peer(no_done) as url:
        ex = await _engine(client, url).chat(
            canary_messages(marker), max_tokens=16, stream=True, timeout=5
        )
    assert ex.transport_error is None
    assert not ex.stream_terminated
    assert ex.answer == "hi"
    assert ex.error_detail == "stream ended without [DONE] (between events, 1 chunks)"


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b"<html>oops</html>", "2xx body is not JSON (17 bytes): <html>oops</html>"),
        (b'{"choices": []}', "2xx body has an empty choices array"),
        (b'{"object": "list"}', "2xx body has no choices array"),
        (b"[1, 2]", "2xx body is a JSON list, not an object"),
        (
            b'{"error": {"message": "upstream exploded", "code": 500}}',
            "2xx body carries an error object: upstream exploded",
        ),
        (b'{"choices": [{"index": 0}]}', "choices[0] has no message object"),
    ],
)
async def test_a_2xx_body_that_is_not_a_completion_is_unparsed_with_a_precise_detail(
    client: httpx.AsyncClient, marker: str, body: bytes, detail: str
) -> None:
    """Malformed 2xx bodies never pass as completions, and say what was wrong."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()

    async with tcp_peer(serve) as url:
        ex = await _engine(client, url).chat(
            canary_messages(marker), max_tokens=16, stream=False, timeout=5
        )
    assert ex.status == 200
    assert ex.transport_error is None
    assert not ex.body_parsed
    assert ex.error_detail == detail


async def test_an_unusable_url_is_a_protocol_error_not_an_exception(
    client: httpx.AsyncClient, marker: str
) -> None:
    """A URL httpx cannot send to (here an unsupported scheme) is recorded, never raised."""
    ex = await _engine(client, "ftp://127.0.0.1/v1").chat(
        canary_messages(marker), max_tokens=16, stream=False, timeout=5
    )
    assert ex.status is None
    assert ex.transport_error is TransportError.PROTOCOL
    assert ex.error_detail is not None and ex.error_detail.startswith("protocol: ")
