"""Helpers for engine tests: canary-like messages and broken peers.

The LLM endpoint is always kvwatch's simulator. The hostile peers here are not LLM fakes:
they are broken TCP servers (stall after headers, cut a stream, send garbage) of the kind a
real network produces, which no engine can be asked to reproduce on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from kvwatch.canary.model import Message

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def canary_messages(marker: str, filler_words: int = 20) -> list[Message]:
    filler = " ".join(f"word{i % 97} lorem ipsum" for i in range(filler_words))
    return [
        Message("system", "You answer with the code you were given, nothing else."),
        Message("user", f"Remember this code: {marker}. {filler} What was the code?"),
    ]


@contextlib.asynccontextmanager
async def tcp_peer(handler: Handler) -> AsyncIterator[str]:
    """Serve ``handler`` on a loopback port; yields ``http://127.0.0.1:PORT/v1``."""

    writers: set[asyncio.StreamWriter] = set()

    async def guarded(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.add(writer)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(guarded, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.close()
        # Handlers may still be sleeping in a stall; closing their sockets ends them.
        for writer in writers:
            writer.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """Read one HTTP/1.1 request (headers and a Content-Length body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    body = await reader.readexactly(length) if length else b""
    return head + body
