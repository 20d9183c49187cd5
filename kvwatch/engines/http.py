"""HTTP helpers shared by engine adapters: capped body reads, timing, progress ticks, and the
mapping from transport exceptions to :class:`~kvwatch.canary.model.TransportError`."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
import zlib
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass, field

import httpx

from kvwatch.canary.model import TransportError
from kvwatch.engines.base import ProgressCallback
from kvwatch.limits import EXCHANGE_ERROR_CHARS

MiB = 1024 * 1024
DEFAULT_BODY_LIMIT = 4 * MiB
DETAIL_CHARS = 300  # one line of error detail
# Largest piece one inflate step may produce. httpx's own decoders inflate a whole network
# read at once: 64 KB of gzip can hold 64 MB, so a small bomb would blow past any body cap
# before the cap is looked at.
INFLATE_PIECE = 64 * 1024


class BodyTooLarge(Exception):
    """The response body went past the read cap."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"response body exceeded the {limit}-byte read cap")
        self.limit = limit


@dataclass(slots=True)
class Stopwatch:
    """Monotonic timings of one exchange: first body byte and total."""

    started: float = field(default_factory=time.monotonic)
    first_byte: float | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def mark_first_byte(self) -> None:
        if self.first_byte is None:
            self.first_byte = time.monotonic()

    @property
    def ttfb(self) -> float | None:
        return None if self.first_byte is None else self.first_byte - self.started


class _Inflater:
    """Bounded gzip/deflate decoding: every output piece is at most INFLATE_PIECE bytes."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        gzip = encoding in ("gzip", "x-gzip")
        self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS if gzip else zlib.MAX_WBITS)
        # "deflate" comes with or without its zlib wrapper (httpx accepts both, so kvwatch
        # does too): the first two bytes decide, so they are held until both arrived.
        self._head: bytes | None = None if gzip else b""

    def feed(self, data: bytes) -> Iterator[bytes]:
        if self._head is not None:
            self._head += data
            if len(self._head) < 2:
                return
            data, self._head = self._head, None
            cmf, flg = data[0], data[1]
            if cmf & 0x0F != 8 or ((cmf << 8) | flg) % 31 != 0:
                self._zlib = zlib.decompressobj(-zlib.MAX_WBITS)
        while not self._zlib.eof:
            try:
                out = self._zlib.decompress(data, INFLATE_PIECE)
            except zlib.error as exc:
                raise httpx.DecodingError(f"{self.encoding} body cannot be decoded: {exc}") from exc
            data = self._zlib.unconsumed_tail
            if out:
                yield out
            # A full piece may leave output inside zlib even with no input left: ask again.
            if not data and len(out) < INFLATE_PIECE:
                return


def _inflated(pieces: Iterable[bytes], inflater: _Inflater) -> Iterator[bytes]:
    for piece in pieces:
        yield from inflater.feed(piece)


async def iter_body(response: httpx.Response) -> AsyncIterator[bytes]:
    """The decoded body of a streamed response, in pieces of bounded size.

    Used instead of ``aiter_bytes`` so a compressed body is inflated a piece at a time and a
    caller's size cap stops a decompression bomb early. Unknown encodings pass through
    unchanged, as in httpx (the body then fails to parse, which is the finding)."""
    encodings = [
        value.strip().lower()
        for value in response.headers.get_list("content-encoding", split_commas=True)
    ]
    inflaters = [_Inflater(e) for e in reversed(encodings) if e in ("gzip", "x-gzip", "deflate")]
    async for raw in response.aiter_raw():
        pieces: Iterable[bytes] = (raw,)
        for inflater in inflaters:
            pieces = _inflated(pieces, inflater)
        for piece in pieces:
            if piece:
                yield piece


async def read_capped(
    response: httpx.Response, limit: int, clock: Stopwatch | None = None
) -> bytes:
    """Read a streamed response body, stopping with :class:`BodyTooLarge` past ``limit`` bytes
    (a misbehaving endpoint must not make the monitor buffer gigabytes)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in iter_body(response):
        if clock is not None and chunk:
            clock.mark_first_byte()
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def read_prefix(response: httpx.Response, limit: int) -> bytes:
    """Read at most ``limit`` bytes of a body and drop the rest (for error bodies, whose status
    is the fact and whose text is only evidence)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in iter_body(response):
        room = limit - size
        chunks.append(chunk[:room])
        size += min(len(chunk), room)
        if size >= limit:
            break
    return b"".join(chunks)


def bounded_text(data: bytes | str, limit: int = EXCHANGE_ERROR_CHARS) -> str:
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    if len(text) <= limit:
        return text
    return text[:limit] + f"... [{len(text) - limit} more characters]"


def one_line(text: str, limit: int = DETAIL_CHARS) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


@contextlib.asynccontextmanager
async def progress_ticks(
    progress: ProgressCallback | None,
    clock: Stopwatch,
    *,
    interval: float = 5.0,
) -> AsyncIterator[None]:
    """Call ``progress`` every ``interval`` seconds with what the request is waiting for, so a
    CLI can show that a minutes-long prefill is alive. The ticker is a task cancelled on exit."""
    if progress is None:
        yield
        return

    async def tick() -> None:
        while True:
            await asyncio.sleep(interval)
            phase = "waiting for first byte" if clock.first_byte is None else "receiving answer"
            # A broken callback must not break the probe; progress is cosmetic.
            with contextlib.suppress(Exception):
                progress(f"{phase}, {clock.elapsed():.0f} s")

    task = asyncio.create_task(tick())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def classify_transport_error(exc: BaseException) -> TransportError:
    """Map an exception raised while talking to an engine to a TransportError kind."""
    if isinstance(exc, BodyTooLarge):
        return TransportError.TOO_LARGE
    if _caused_by_tls(exc):
        return TransportError.PROTOCOL
    # A connect timeout means the engine was never reached: that is a connection problem, not
    # a slow prefill, and the two deserve different words on a dashboard.
    if isinstance(exc, httpx.ConnectTimeout | httpx.ConnectError | httpx.ProxyError):
        return TransportError.CONNECT
    if isinstance(exc, httpx.TimeoutException | TimeoutError):
        return TransportError.TIMEOUT
    if isinstance(exc, httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError):
        return TransportError.READ
    return TransportError.PROTOCOL


def describe_transport_error(exc: BaseException, *, deadline: float | None = None) -> str:
    kind = classify_transport_error(exc)
    if kind is TransportError.TIMEOUT and deadline is not None:
        return f"timeout: no complete answer within the {deadline:g} s deadline"
    message = str(exc) or exc.__class__.__name__
    return one_line(f"{kind.value}: {exc.__class__.__name__}: {message}")


def _caused_by_tls(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ssl.SSLError | ssl.CertificateError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False
