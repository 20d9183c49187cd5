"""httpx responses freed as soon as they are closed, not by the cyclic garbage collector.

httpx (0.28 and 0.29) wraps every response's body in a stream that refers back to the
response, to set ``response.elapsed`` when it is closed: response -> stream -> response.
Reference counting cannot free a cycle, so each exchange's response, request, headers,
URLs and httpcore's pool request and events (45 objects per request, measured with
``gc.DEBUG_SAVEALL``) stayed until a garbage collection found them. At 50 probes/s many
were still in use when a young collection ran, so they reached the oldest generation, which
CPython collects only once it has grown by a quarter: a daemon with two million objects
piled up to 300,000 dead ones between full collections, about 20 MB of RSS at 1,000
endpoints (issue 25; README, Memory).

:func:`event_hooks` wraps each response's stream in one that, once closed, replaces itself
on the response with an empty stream: the cycle is gone, and the response goes with its last
reference. The wrapper holds the response weakly, so it makes no cycle of its own. The same
change is proposed upstream (encode/httpx#3733, a weak reference in the bound stream).
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx

# What a closed response's stream becomes: httpx reads nothing more from it (a closed
# response's body is already read, or reading it raises StreamClosed), and it is stateless,
# so one serves every response.
_CLOSED = httpx.ByteStream(b"")


class _ReleasingStream(httpx.AsyncByteStream):
    def __init__(self, stream: httpx.AsyncByteStream, response: httpx.Response) -> None:
        self._stream = stream
        self._response = weakref.ref(response)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            response = self._response()
            if response is not None:
                response.stream = _CLOSED


async def _release_on_close(response: httpx.Response) -> None:
    stream = response.stream
    if isinstance(stream, httpx.AsyncByteStream):
        response.stream = _ReleasingStream(stream, response)


def event_hooks() -> dict[str, list[Callable[[httpx.Response], Awaitable[None]]]]:
    """``event_hooks`` for every ``httpx.AsyncClient`` kvwatch builds."""
    return {"response": [_release_on_close]}
