"""A usage count that is no count is a fact the adapter keeps, on every API, streamed or not.

A negative, fractional, string or boolean prompt count used to become ``None`` ("engine
reported no usage"), so the reason hid what the engine said. Each adapter now records the
field and the value as sent, and the verdict names them. Served through httpx's mock
transport: the whole adapter path, no network.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from kvwatch.canary.model import Exchange, Message, PlannedPrompt, ProbeKind, Verdict
from kvwatch.canary.verdicts import judge
from kvwatch.engines.factory import build_engine

MARKER = "KVW-7F3K-9QX2-M4TD"
ANSWER = f"The code is {MARKER}."
PLANNED = 4064

Body = Callable[[object, bool], tuple[bytes, str]]


def _sse(*payloads: object) -> bytes:
    return b"".join(b"data: " + json.dumps(p).encode() + b"\n\n" for p in payloads)


def _openai_chat(count: object, stream: bool) -> tuple[bytes, str]:
    usage = {"prompt_tokens": count, "completion_tokens": 5}
    if not stream:
        body = {"choices": [{"index": 0, "message": {"content": ANSWER}}], "usage": usage}
        return json.dumps(body).encode(), "application/json"
    delta = {"choices": [{"index": 0, "delta": {"content": ANSWER}, "finish_reason": "stop"}]}
    raw = _sse(delta, {"choices": [], "usage": usage}) + b"data: [DONE]\n\n"
    return raw, "text/event-stream"


def _openai_completions(count: object, stream: bool) -> tuple[bytes, str]:
    usage = {"prompt_tokens": count, "completion_tokens": 5}
    choice = {"index": 0, "text": ANSWER, "finish_reason": "stop"}
    if not stream:
        return json.dumps({"choices": [choice], "usage": usage}).encode(), "application/json"
    raw = _sse({"choices": [choice]}, {"choices": [], "usage": usage}) + b"data: [DONE]\n\n"
    return raw, "text/event-stream"


def _anthropic(count: object, stream: bool) -> tuple[bytes, str]:
    usage = {"input_tokens": count, "output_tokens": 5}
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


def _tgi(count: object, stream: bool) -> tuple[bytes, str]:
    details = {"finish_reason": "eos_token", "generated_tokens": 5, "input_length": count}
    if not stream:
        return json.dumps(
            {"generated_text": ANSWER, "details": details}
        ).encode(), "application/json"
    final = {"token": {"text": ANSWER, "special": False}, "generated_text": ANSWER}
    return _sse({**final, "details": details}), "text/event-stream"


def _ollama(count: object, stream: bool) -> tuple[bytes, str]:
    last = {"done": True, "done_reason": "stop", "prompt_eval_count": count, "eval_count": 5}
    if not stream:
        body = {"message": {"role": "assistant", "content": ANSWER}, **last}
        return json.dumps(body).encode(), "application/json"
    first = {"message": {"role": "assistant", "content": ANSWER}, "done": False}
    lines = [first, {"message": {"role": "assistant", "content": ""}, **last}]
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines), "application/x-ndjson"


# (flavour, api, body, the field as the reason names it)
APIS: dict[str, tuple[str, str, Body, str]] = {
    "openai-chat": ("openai", "chat", _openai_chat, "usage.prompt_tokens"),
    "openai-completions": ("vllm", "completions", _openai_completions, "usage.prompt_tokens"),
    "anthropic": ("anthropic", "native", _anthropic, "usage.input_tokens"),
    "tgi-generate": ("tgi", "generate", _tgi, "details.input_length"),
    "ollama": ("ollama", "native", _ollama, "prompt_eval_count"),
}


async def _chat(name: str, count: object, stream: bool) -> Exchange:
    flavour, api, body, _ = APIS[name]
    raw, content_type = body(count, stream)

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
            api=api,
        )
        return await engine.chat([Message("user", "…")], max_tokens=16, stream=stream, timeout=5)


def _plan() -> PlannedPrompt:
    return PlannedPrompt(
        kind=ProbeKind.UNDER,
        messages=(Message("user", "…"),),
        marker=MARKER,
        planned_tokens=PLANNED,
        target_tokens=PLANNED,
        exact=True,
        tolerance=0,
        max_tokens=32,
        window=4096,
    )


@pytest.mark.parametrize(
    ("count", "shown"), [(-7, "-7"), (4064.5, "4064.5"), ("4064", '"4064"'), (True, "true")]
)
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("name", sorted(APIS))
async def test_a_prompt_count_that_is_no_count_is_kept_as_a_fact_and_judged_unbelievable(
    name: str, stream: bool, count: object, shown: str
) -> None:
    """Negative, fractional, string or bool: recorded with its value, and no pass."""
    ex = await _chat(name, count, stream)
    field = APIS[name][3]
    assert ex.prompt_tokens is None
    assert ex.unusable_usage == f"{field} {shown}"
    judgement = judge(_plan(), ex)
    assert judgement.verdict is Verdict.ERROR
    assert judgement.reason == f"the engine's usage report cannot be believed: {field} {shown}"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("name", sorted(APIS))
async def test_a_plausible_prompt_count_is_read_as_before(name: str, stream: bool) -> None:
    """The control: the same answer with an integer count passes."""
    ex = await _chat(name, PLANNED, stream)
    assert (ex.prompt_tokens, ex.unusable_usage) == (PLANNED, None)
    assert judge(_plan(), ex).verdict is Verdict.PASS


@pytest.mark.parametrize(("header", "shown"), [(b"\xb2", '"\\u00b2"'), (b"-7", '"-7"')])
async def test_a_tgi_prompt_header_that_is_no_count_is_kept_as_a_fact(
    header: bytes, shown: str
) -> None:
    """``x-prompt-tokens: ²`` (a digit to str.isdigit, not to int) is recorded, not raised."""
    raw = json.dumps({"generated_text": ANSWER, "details": {"generated_tokens": 5}}).encode()

    def answer(request: httpx.Request) -> httpx.Response:
        headers = [(b"content-type", b"application/json"), (b"x-prompt-tokens", header)]
        return httpx.Response(200, stream=httpx.ByteStream(raw), headers=headers)

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        engine = build_engine(
            flavour="tgi",
            url="http://engine.test/v1",
            model="m",
            api_key=None,
            body_limit_bytes=1 << 20,
            client=client,
            api="generate",
        )
        ex = await engine.chat([Message("user", "…")], max_tokens=16, stream=False, timeout=5)
    assert (ex.prompt_tokens, ex.unusable_usage) == (None, f"x-prompt-tokens {shown}")
