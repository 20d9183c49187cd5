"""The engine's count of prompt tokens served from its prefix cache is read where the API
puts it, and a count the engine did not send stays None (absent is not 0).

Served through httpx's mock transport: the whole adapter path, no network.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from kvwatch.canary.model import Exchange, Message
from kvwatch.engines.factory import build_engine

ANSWER = "The code is 4821."


def _sse(*payloads: object) -> bytes:
    return b"".join(b"data: " + json.dumps(p).encode() + b"\n\n" for p in payloads)


def _openai(usage: dict[str, Any], stream: bool) -> tuple[bytes, str]:
    if not stream:
        body = {"choices": [{"index": 0, "message": {"content": ANSWER}}], "usage": usage}
        return json.dumps(body).encode(), "application/json"
    delta = {"choices": [{"index": 0, "delta": {"content": ANSWER}, "finish_reason": "stop"}]}
    return _sse(delta, {"choices": [], "usage": usage}) + b"data: [DONE]\n\n", "text/event-stream"


def _anthropic(usage: dict[str, Any], stream: bool) -> tuple[bytes, str]:
    if not stream:
        body = {"content": [{"type": "text", "text": ANSWER}], "usage": usage}
        return json.dumps(body).encode(), "application/json"
    raw = _sse(
        {"type": "message_start", "message": {"usage": usage}},
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": ANSWER}},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}},
        {"type": "message_stop"},
    )
    return raw, "text/event-stream"


async def _chat(flavour: str, raw: bytes, content_type: str, **options: Any) -> Exchange:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, stream=httpx.ByteStream(raw), headers={"content-type": content_type}
        )

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        engine = build_engine(
            flavour=flavour,
            url="http://engine.test/v1",
            model="m",
            api_key=None,
            body_limit_bytes=1 << 20,
            client=client,
        )
        return await engine.chat([Message("user", "…")], max_tokens=16, timeout=5, **options)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("flavour", ["openai", "vllm", "sglang", "llamacpp"])
async def test_an_openai_compatible_cached_count_is_read_from_prompt_tokens_details(
    flavour: str, stream: bool
) -> None:
    """``usage.prompt_tokens_details.cached_tokens`` is the exchange's cached prompt tokens."""
    usage = {"prompt_tokens": 3000, "completion_tokens": 5}
    raw, kind = _openai({**usage, "prompt_tokens_details": {"cached_tokens": 2992}}, stream)
    ex = await _chat(flavour, raw, kind, stream=stream)
    assert (ex.prompt_tokens, ex.cached_prompt_tokens) == (3000, 2992)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": 3000},  # vLLM without --enable-prompt-tokens-details, or 0 cached
        {"prompt_tokens": 3000, "prompt_tokens_details": None},
        {"prompt_tokens": 3000, "prompt_tokens_details": {"audio_tokens": 0}},
        {"prompt_tokens": 3000, "prompt_tokens_details": {"cached_tokens": "2992"}},
    ],
)
async def test_a_cached_count_the_engine_did_not_send_stays_none(
    usage: dict[str, Any], stream: bool
) -> None:
    """No details, null details, details without the count, a string: None, never 0."""
    raw, kind = _openai(usage, stream)
    ex = await _chat("vllm", raw, kind, stream=stream)
    assert ex.prompt_tokens == 3000
    assert ex.cached_prompt_tokens is None


@pytest.mark.parametrize("stream", [False, True])
async def test_a_reported_zero_is_kept_as_zero(stream: bool) -> None:
    """llama.cpp reports 0 cached tokens on a miss: a fact, unlike an absent count."""
    raw, kind = _openai(
        {"prompt_tokens": 30, "prompt_tokens_details": {"cached_tokens": 0}}, stream
    )
    assert (await _chat("llamacpp", raw, kind, stream=stream)).cached_prompt_tokens == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_cache_reads_are_the_cached_prompt_tokens(stream: bool) -> None:
    """``cache_read_input_tokens`` is the cached count; the prompt count adds every part."""
    usage = {"input_tokens": 8, "cache_read_input_tokens": 2900, "output_tokens": 5}
    raw, kind = _anthropic(usage, stream)
    ex = await _chat("anthropic", raw, kind, stream=stream)
    assert (ex.prompt_tokens, ex.cached_prompt_tokens) == (2908, 2900)


@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_without_cache_reads_says_nothing_cached(stream: bool) -> None:
    """No ``cache_read_input_tokens``: unknown, not 0."""
    raw, kind = _anthropic({"input_tokens": 8, "output_tokens": 5}, stream)
    assert (await _chat("anthropic", raw, kind, stream=stream)).cached_prompt_tokens is None


async def test_hanging_up_after_the_first_chunk_keeps_what_arrived() -> None:
    """The abort step's request: the stream is left after its first chunk, unterminated."""
    first = {"choices": [{"index": 0, "delta": {"content": "The"}}]}
    rest = {"choices": [{"index": 0, "delta": {"content": " code"}, "finish_reason": "stop"}]}

    # The mock transport delivers the body as one chunk per frame yielded below.
    class Frames(httpx.AsyncByteStream):
        async def __aiter__(self):  # type: ignore[no-untyped-def]
            yield _sse(first)
            yield _sse(rest) + b"data: [DONE]\n\n"

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=Frames(), headers={"content-type": "text/event-stream"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        engine = build_engine(
            flavour="llamacpp",
            url="http://engine.test/v1",
            model="m",
            api_key=None,
            body_limit_bytes=1 << 20,
            client=client,
        )
        ex = await engine.chat(
            [Message("user", "…")],
            max_tokens=16,
            stream=True,
            timeout=5,
            hang_up_after_first_chunk=True,
        )
    assert (ex.answer, ex.stream_terminated) == ("The", False)
