"""Fuzzing the pure response path: 2xx body parsing, the stream reader, the rejection
classifier and bounded decoding. No crash on any input, and never a pass on garbage.

(The SSE parser's own byte-level fuzzing lives in tests/engines/test_sse.py; here it is
driven through the OpenAI stream reader, which is what a probe actually uses.)
"""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvwatch.canary.model import Exchange, ProbeKind, Rejection, Verdict
from kvwatch.canary.verdicts import judge
from kvwatch.engines.http import INFLATE_PIECE, iter_body
from kvwatch.engines.openai import (
    MAX_TOKEN_COUNT,
    StreamReader,
    parse_completion,
    reject_implausible_usage,
)
from kvwatch.engines.rejections import CONTEXT_STATUSES, classify_rejection
from kvwatch.engines.sse import SSEDecodeError
from tests.fuzz.strategies import garbage_bodies, json_values, plan, sse_streams

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(json_values)
def test_any_json_value_parses_to_an_answer_or_a_problem(payload: Any) -> None:
    """parse_completion is total: exactly one of an answer and a problem, typed fields."""
    parsed = parse_completion(payload)
    assert (parsed.answer is None) != (parsed.problem is None)
    for count in (parsed.prompt_tokens, parsed.completion_tokens):
        assert count is None or (isinstance(count, int) and not isinstance(count, bool))


@FAST
@given(json_values, st.sampled_from([ProbeKind.UNDER, ProbeKind.BASELINE]))
def test_a_parsed_2xx_body_without_the_marker_never_passes(payload: Any, kind: ProbeKind) -> None:
    """Whatever shape a 2xx body has, a recall probe judged on it does not pass."""
    parsed = parse_completion(payload)
    ex = Exchange(
        status=200,
        answer=parsed.answer,
        body_parsed=parsed.problem is None,
        prompt_tokens=parsed.prompt_tokens,
        completion_tokens=parsed.completion_tokens,
        error_detail=parsed.problem,
    )
    reject_implausible_usage(ex)
    assert judge(plan(kind), ex).verdict is not Verdict.PASS


@FAST
@given(sse_streams(), st.integers(min_value=1, max_value=64))
def test_a_garbage_stream_never_crashes_the_reader_nor_passes(raw: bytes, piece: int) -> None:
    """Any SSE-ish bytes, in any chunking: the reader ends in facts, the verdict is no pass."""
    ex = Exchange(status=200, streamed=True)
    reader = StreamReader(ex)
    try:
        for start in range(0, len(raw), piece):
            reader.feed(raw[start : start + piece])
    except SSEDecodeError:
        pass  # the adapter records this as a protocol error
    finally:
        reader.finish()
    reject_implausible_usage(ex)
    assert judge(plan(), ex).verdict is not Verdict.PASS


@FAST
@given(st.integers(min_value=100, max_value=599), garbage_bodies)
def test_the_rejection_classifier_is_total_and_status_bound(status: int, body: bytes) -> None:
    """Any status and body give a Rejection; only 400/413/422 can be a context-length one."""
    for given_body in (body, body.decode("utf-8", "replace")):
        rejection = classify_rejection(status, given_body)
        assert isinstance(rejection, Rejection)
        if status not in CONTEXT_STATUSES:
            assert rejection is Rejection.OTHER


@FAST
@given(st.integers(min_value=-(2**80), max_value=2**80))
def test_implausible_usage_is_dropped_with_a_reason(count: int) -> None:
    """Negative or astronomical counts never reach the store but are kept as what was sent,
    and never pass; plausible ones are kept as counts."""
    ex = Exchange(status=200, body_parsed=True, answer="", prompt_tokens=count)
    reject_implausible_usage(ex)
    if 0 <= count <= MAX_TOKEN_COUNT:
        assert ex.prompt_tokens == count and ex.unusable_usage is None
    else:
        assert ex.prompt_tokens is None
        assert ex.unusable_usage is not None and ex.unusable_usage.startswith("prompt_tokens ")
        assert judge(plan(), ex).verdict is Verdict.ERROR


def _encode(data: bytes, encoding: str) -> bytes:
    if encoding == "gzip":
        return gzip.compress(data)
    if encoding == "deflate":
        return zlib.compress(data)
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)  # deflate without the zlib wrapper
    return raw.compress(data) + raw.flush()


@settings(max_examples=100, deadline=None)
@given(
    st.binary(max_size=4 * INFLATE_PIECE) | st.integers(0, 600_000).map(lambda n: b"a" * n),
    st.sampled_from(["gzip", "deflate", "raw-deflate", "gzip, gzip"]),
    st.integers(min_value=1, max_value=70_000),
)
def test_bounded_decoding_returns_the_body_in_bounded_pieces(
    data: bytes, encoding: str, network_read: int
) -> None:
    """iter_body inflates exactly what httpx would, never more than a piece at a time."""
    body = data
    for step in encoding.split(", "):
        body = _encode(body, step)
    header = "deflate" if encoding == "raw-deflate" else encoding
    reads = [body[i : i + network_read] for i in range(0, len(body), network_read)]

    async def decode() -> list[bytes]:
        response = httpx.Response(
            200, headers={"content-encoding": header}, stream=httpx.ByteStream(b"")
        )
        response.stream = _Chunks(reads)
        return [piece async for piece in iter_body(response)]

    pieces = asyncio.run(decode())
    assert b"".join(pieces) == data
    assert all(0 < len(p) <= INFLATE_PIECE for p in pieces)


class _Chunks(httpx.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def __aiter__(self):  # type: ignore[override]
        for chunk in self.chunks:
            yield chunk


def test_a_corrupt_gzip_body_is_a_decoding_error() -> None:
    """Bytes labelled gzip that are not gzip raise httpx.DecodingError (a transport fact)."""

    async def decode() -> None:
        response = httpx.Response(200, headers={"content-encoding": "gzip"}, stream=_Chunks([]))
        response.stream = _Chunks([b"not gzip at all"])
        async for _ in iter_body(response):
            pass

    try:
        asyncio.run(decode())
    except httpx.DecodingError as exc:
        assert "gzip body cannot be decoded" in str(exc)
    else:
        raise AssertionError("corrupt gzip was accepted")


def test_the_generators_can_produce_a_completion_that_reaches_the_marker_check() -> None:
    """Guard against a vacuous fuzz: a garbage completion gets as far as marker_missing."""
    body = {"choices": [{"message": {"content": "no idea"}}], "usage": {"prompt_tokens": 100}}
    parsed = parse_completion(json.loads(json.dumps(body)))
    ex = Exchange(
        status=200, answer=parsed.answer, body_parsed=True, prompt_tokens=parsed.prompt_tokens
    )
    assert judge(plan(), ex).verdict is Verdict.MARKER_MISSING
