"""A hostile HTTP peer: one loopback server with many ways of answering badly.

Not an LLM fake: a broken peer, of the kind a load balancer, a proxy, a crashed worker or a
confused engine produces. Each behaviour is served under its own first path segment, so one
server gives every behaviour its own endpoint URL: ``http://127.0.0.1:PORT/<behaviour>/v1``.
Bodies are written in small pieces with back-pressure, so a 200 MB answer never sits in this
process's memory either.

``garbage`` holds arbitrary bodies for fuzzing, served with status 200 under
``/garbage-<key>/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import ssl
import struct
import subprocess
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.engines.wire import read_request

Writer = asyncio.StreamWriter
Behaviour = Callable[["HostileServer", Writer, bytes], Awaitable[None]]

MiB = 1024 * 1024
GIGANTIC_BYTES = 200 * MiB
BOMB_BYTES = 256 * MiB
PIECE = 64 * 1024
SSE = b"content-type: text/event-stream\r\ncache-control: no-cache\r\n"
JSON = b"content-type: application/json\r\n"


def _head(status: str, headers: bytes = b"", body_length: int | None = None) -> bytes:
    length = b"" if body_length is None else f"content-length: {body_length}\r\n".encode()
    return f"HTTP/1.1 {status}\r\n".encode() + headers + length + b"\r\n"


async def _send(writer: Writer, status: str, headers: bytes, body: bytes) -> None:
    writer.write(_head(status, headers, len(body)) + body)
    await writer.drain()


def _frame(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _delta(content: str, finish: str | None = None) -> dict[str, object]:
    return {"choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]}


async def _forever() -> None:
    # The peer is closed by the server's teardown (or the client's deadline), never by us.
    await asyncio.Event().wait()


# -- the behaviours ------------------------------------------------------------------------


async def html_error_page(server: HostileServer, w: Writer, request: bytes) -> None:
    body = b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"
    await _send(w, "200 OK", b"content-type: text/html\r\n", body)


async def invalid_json(server: HostileServer, w: Writer, request: bytes) -> None:
    await _send(w, "200 OK", JSON, b'{"choices": [{"message": {"content": "hel')


async def wrong_shape(server: HostileServer, w: Writer, request: bytes) -> None:
    body = {"result": {"text": "hello"}, "usage": {"prompt_tokens": 100}}
    await _send(w, "200 OK", JSON, json.dumps(body).encode())


async def sse_cut_mid_event(server: HostileServer, w: Writer, request: bytes) -> None:
    # No length and no chunking: the body ends when the connection closes, which is a
    # clean end as far as HTTP goes. Only the SSE framing shows the event was cut.
    w.write(_head("200 OK", SSE + b"connection: close\r\n"))
    w.write(_frame(_delta("The code is ")) + b'data: {"choices": [{"index": 0, "del')
    await w.drain()


async def sse_without_done(server: HostileServer, w: Writer, request: bytes) -> None:
    body = _frame(_delta("I cannot recall", "stop")) + _frame(
        {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 3}}
    )
    await _send(w, "200 OK", SSE, body)


async def gigantic_body(server: HostileServer, w: Writer, request: bytes) -> None:
    w.write(_head("200 OK", JSON, GIGANTIC_BYTES))
    piece = b" " * PIECE
    for _ in range(GIGANTIC_BYTES // PIECE):
        w.write(piece)
        await w.drain()
        server.gigantic_bytes_sent += PIECE


async def slow_drip(server: HostileServer, w: Writer, request: bytes) -> None:
    w.write(_head("200 OK", SSE + b"connection: close\r\n"))
    for byte in _frame(_delta("x")) * 1000:
        w.write(bytes([byte]))
        await w.drain()
        await asyncio.sleep(1.0)


async def wrong_content_type(server: HostileServer, w: Writer, request: bytes) -> None:
    # A well-formed stream labelled as plain text: nobody can tell it is SSE.
    body = _frame(_delta("hello", "stop")) + b"data: [DONE]\n\n"
    await _send(w, "200 OK", b"content-type: text/plain\r\n", body)


async def redirect_loop(server: HostileServer, w: Writer, request: bytes) -> None:
    path = request.split(b" ", 2)[1].decode()
    await _send(w, "302 Found", f"location: {path}\r\n".encode(), b"")


async def redirect_elsewhere(server: HostileServer, w: Writer, request: bytes) -> None:
    # 307 keeps the method and body: a follower re-sends the canary to another host.
    location = f"{server.elsewhere}/chat/completions"
    await _send(w, "307 Temporary Redirect", f"location: {location}\r\n".encode(), b"")


async def connection_reset(server: HostileServer, w: Writer, request: bytes) -> None:
    sock = w.get_extra_info("socket")
    # SO_LINGER with a zero timeout makes close() send an RST instead of a FIN.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    w.transport.abort()


async def headers_then_silence(server: HostileServer, w: Writer, request: bytes) -> None:
    w.write(_head("200 OK", SSE + b"transfer-encoding: chunked\r\n"))
    await w.drain()
    await _forever()


async def empty_choices(server: HostileServer, w: Writer, request: bytes) -> None:
    body = {"object": "chat.completion", "choices": [], "usage": {"prompt_tokens": 100}}
    await _send(w, "200 OK", JSON, json.dumps(body).encode())


async def non_utf8(server: HostileServer, w: Writer, request: bytes) -> None:
    body = b'{"choices": [{"index": 0, "message": {"content": "\xff\xfe\xc3(\x80"}}]}'
    await _send(w, "200 OK", JSON, body)


async def chunked_broken(server: HostileServer, w: Writer, request: bytes) -> None:
    w.write(_head("200 OK", SSE + b"transfer-encoding: chunked\r\n"))
    w.write(b"zz;not-hex\r\n" + _frame(_delta("hi")) + b"\r\n")
    await w.drain()


async def content_length_mismatch(server: HostileServer, w: Writer, request: bytes) -> None:
    body = json.dumps({"choices": [{"index": 0, "message": {"content": "hi"}}]}).encode()
    w.write(_head("200 OK", JSON, len(body) + 5000) + body)
    await w.drain()


async def no_content(server: HostileServer, w: Writer, request: bytes) -> None:
    w.write(_head("204 No Content"))
    await w.drain()


async def null_content(server: HostileServer, w: Writer, request: bytes) -> None:
    body = {
        "choices": [{"index": 0, "message": {"role": "assistant", "content": None}}],
        "usage": {"prompt_tokens": server.claimed_prompt_tokens, "completion_tokens": 0},
    }
    await _send(w, "200 OK", JSON, json.dumps(body).encode())


async def negative_usage(server: HostileServer, w: Writer, request: bytes) -> None:
    body = {
        "choices": [{"index": 0, "message": {"content": "I do not know."}}],
        "usage": {"prompt_tokens": -7, "completion_tokens": 10**30},
    }
    await _send(w, "200 OK", JSON, json.dumps(body).encode())


async def huge_sse_lines(server: HostileServer, w: Writer, request: bytes) -> None:
    w.write(_head("200 OK", SSE + b"connection: close\r\n"))
    w.write(b'data: {"choices": [{"index": 0, "delta": {"content": "')
    for _ in range(8 * MiB // PIECE):  # one 8 MB data line
        w.write(b"A" * PIECE)
        await w.drain()
    w.write(b'"}}]}\n\n')
    await w.drain()


async def http09_garbage(server: HostileServer, w: Writer, request: bytes) -> None:
    w.write(b"hello there, this is not HTTP at all\n\x00\x01\x02\n")
    await w.drain()


async def gzip_bomb(server: HostileServer, w: Writer, request: bytes) -> None:
    # 256 MB of spaces compress to about 250 KB: a decoder that inflates without a bound
    # holds a whole network read's worth of it (~64 MB per 64 KB) at once.
    if not server.bomb:
        server.bomb = _gzip_bomb(BOMB_BYTES)
    await _send(w, "200 OK", JSON + b"content-encoding: gzip\r\n", server.bomb)


async def sse_frames_not_json(server: HostileServer, w: Writer, request: bytes) -> None:
    await _send(w, "200 OK", SSE, b"data: hello world\n\ndata: [1, 2, 3]\n\ndata: [DONE]\n\n")


def _prompt_marker(request: bytes) -> str:
    found = re.search(rb"KVW-[0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{4}", request)
    return found.group().decode() if found else "none"


async def sse_text_after_done(server: HostileServer, w: Writer, request: bytes) -> None:
    # The prompt's own marker, and other usage, sent after [DONE] in the same write (so in
    # the same read): only a reader that goes past the terminator finds them.
    usage = {"choices": [], "usage": {"prompt_tokens": server.claimed_prompt_tokens}}
    after = {"choices": [], "usage": {"prompt_tokens": 1}}
    body = (
        _frame(_delta("I do not know.", "stop"))
        + _frame(usage)
        + b"data: [DONE]\n\n"
        + _frame(_delta(f"The code is {_prompt_marker(request)}."))
        + _frame(after)
        + b"data: [DONE]\n\n"
    )
    await _send(w, "200 OK", SSE, body)


async def impossible_usage(server: HostileServer, w: Writer, request: bytes) -> None:
    # The right answer, with a prompt count no 4,096-token window can hold.
    answer = {"content": f"The code is {_prompt_marker(request)}."}
    body = {
        "choices": [{"index": 0, "message": answer}],
        "usage": {"prompt_tokens": 10**12, "completion_tokens": 9},
    }
    await _send(w, "200 OK", JSON, json.dumps(body).encode())


async def string_usage(server: HostileServer, w: Writer, request: bytes) -> None:
    # The right answer, with its prompt count as a string.
    answer = {"content": f"The code is {_prompt_marker(request)}."}
    body = {
        "choices": [{"index": 0, "message": answer}],
        "usage": {"prompt_tokens": str(server.claimed_prompt_tokens), "completion_tokens": 9},
    }
    await _send(w, "200 OK", JSON, json.dumps(body).encode())


async def serve_garbage(server: HostileServer, w: Writer, request: bytes, key: str) -> None:
    body = server.garbage[key]
    headers = SSE if body.startswith(b"data:") else JSON
    await _send(w, "200 OK", headers, body)


BEHAVIOURS: dict[str, Behaviour] = {
    "html-error-page": html_error_page,
    "invalid-json": invalid_json,
    "wrong-shape": wrong_shape,
    "sse-cut-mid-event": sse_cut_mid_event,
    "sse-without-done": sse_without_done,
    "gigantic-body": gigantic_body,
    "slow-drip": slow_drip,
    "wrong-content-type": wrong_content_type,
    "redirect-loop": redirect_loop,
    "redirect-elsewhere": redirect_elsewhere,
    "connection-reset": connection_reset,
    "headers-then-silence": headers_then_silence,
    "empty-choices": empty_choices,
    "non-utf8": non_utf8,
    "chunked-broken": chunked_broken,
    "content-length-mismatch": content_length_mismatch,
    "no-content": no_content,
    "null-content": null_content,
    "negative-usage": negative_usage,
    "huge-sse-lines": huge_sse_lines,
    "http09-garbage": http09_garbage,
    "gzip-bomb": gzip_bomb,
    "sse-frames-not-json": sse_frames_not_json,
    "sse-text-after-done": sse_text_after_done,
    "impossible-usage": impossible_usage,
    "string-usage": string_usage,
}


def _gzip_bomb(size: int) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: a gzip container
    zeros = b" " * MiB
    parts = [compressor.compress(zeros) for _ in range(size // MiB)]
    return b"".join(parts) + compressor.flush()


@dataclass
class HostileServer:
    """The server's state; use :func:`hostile_server` to run one."""

    base: str = ""
    elsewhere: str = "http://127.0.0.1:9/v1"  # where redirect-elsewhere points
    # The whole window the endpoints are given (4,096): more than any plan here, and no more
    # than an engine could read, so the answer reads as complete and only its content counts.
    claimed_prompt_tokens: int = 4096
    garbage: dict[str, bytes] = field(default_factory=dict)
    gigantic_bytes_sent: int = 0
    bomb: bytes = b""
    requests: list[str] = field(default_factory=list)

    def url_for(self, behaviour: str) -> str:
        return f"{self.base}/{behaviour}/v1"

    async def handle(self, reader: asyncio.StreamReader, writer: Writer) -> None:
        first = await reader.readexactly(1)
        if first == b"\x16":
            # A TLS ClientHello on this plain port: answer in plain HTTP, as nginx or uvicorn
            # do, which the client's TLS layer reads as garbage.
            await _send(writer, "400 Bad Request", b"connection: close\r\n", b"plain HTTP here")
            return
        request = first + await read_request(reader)
        path = request.split(b" ", 2)[1].decode("ascii", "replace")
        name = path.strip("/").split("/", 1)[0]
        self.requests.append(name)
        if name.startswith("garbage-"):
            await serve_garbage(self, writer, request, name.removeprefix("garbage-"))
        elif name in BEHAVIOURS:
            await BEHAVIOURS[name](self, writer, request)
        else:
            await _send(writer, "404 Not Found", b"", b"no such behaviour")


@contextlib.asynccontextmanager
async def hostile_server(
    *, ssl_context: ssl.SSLContext | None = None, elsewhere: str | None = None
) -> AsyncIterator[HostileServer]:
    """Run a :class:`HostileServer` on a free loopback port until the block exits."""
    state = HostileServer()
    if elsewhere is not None:
        state.elsewhere = elsewhere
    writers: set[Writer] = set()
    tasks: set[asyncio.Task[None]] = set()

    async def guarded(reader: asyncio.StreamReader, writer: Writer) -> None:
        writers.add(writer)
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await state.handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass  # the client gave up on us: that is the point of most behaviours
        finally:
            tasks.discard(task)
            writer.close()

    server = await asyncio.start_server(guarded, "127.0.0.1", 0, ssl=ssl_context)
    port = server.sockets[0].getsockname()[1]
    state.base = f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
    try:
        yield state
    finally:
        server.close()
        for writer in writers:
            writer.close()
        # Stalled behaviours wait forever by design; they end with the server.
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()


def self_signed_context(directory: Path) -> ssl.SSLContext:
    """A server TLS context with a fresh self-signed certificate for 127.0.0.1 (openssl CLI)."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
            "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context
