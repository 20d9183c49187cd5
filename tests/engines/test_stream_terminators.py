"""Every streamed API's terminator ends the answer: nothing sent after it counts, in any read.

One hostile stream per reader: a marker-less answer with its usage, the API's own terminator,
then (as a stream that keeps talking would) the marker and other usage. Whether those bytes
share the terminator's read or come later must not change the facts the verdict rests on.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from kvwatch.canary.model import Exchange
from kvwatch.engines.anthropic import AnthropicStreamReader
from kvwatch.engines.completions import CompletionStreamReader
from kvwatch.engines.ollama import NDJSONReader
from kvwatch.engines.openai import StreamAccumulator, StreamReader
from kvwatch.engines.tgi import TGIStreamReader

MARKER = "KVW-7F3K-9QX2-M4TD"
ANSWER = "I do not know."
PROMPT_TOKENS = 4064


def _sse(payload: object, event: str | None = None) -> bytes:
    head = b"" if event is None else f"event: {event}\n".encode()
    return head + b"data: " + json.dumps(payload).encode() + b"\n\n"


def _ndjson(payload: object) -> bytes:
    return json.dumps(payload).encode() + b"\n"


def _openai_chat(text: str, prompt_tokens: int) -> bytes:
    return _sse(
        {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}]}
    ) + _sse({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 5}})


def _openai_completions(text: str, prompt_tokens: int) -> bytes:
    return _sse({"choices": [{"index": 0, "text": text, "finish_reason": "stop"}]}) + _sse(
        {"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 5}}
    )


def _anthropic(text: str, prompt_tokens: int) -> bytes:
    start = {"type": "message_start", "message": {"usage": {"input_tokens": prompt_tokens}}}
    delta = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": text},
    }
    stop = {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {"output_tokens": 5},
    }
    return (
        _sse(start, "message_start")
        + _sse(delta, "content_block_delta")
        + _sse(stop, "message_delta")
    )


def _tgi(text: str, prompt_tokens: int) -> bytes:
    details = {"finish_reason": "eos_token", "generated_tokens": 5, "input_length": prompt_tokens}
    return _sse({"token": {"text": text, "special": False}, "generated_text": None}) + _sse(
        {"token": {"text": "", "special": True}, "generated_text": text, "details": details}
    )


def _ollama(text: str, prompt_tokens: int) -> bytes:
    return _ndjson({"message": {"role": "assistant", "content": text}, "done": False}) + _ndjson(
        {
            "message": {"role": "assistant", "content": ""},
            "done": True,
            "done_reason": "stop",
            "prompt_eval_count": prompt_tokens,
            "eval_count": 5,
        }
    )


# reader, the answer with its usage (ending with the terminator), the same shape again.
Stream = tuple[Callable[[Exchange], StreamAccumulator], bytes, bytes]
STREAMS: dict[str, Stream] = {
    "openai-chat": (
        StreamReader,
        _openai_chat(ANSWER, PROMPT_TOKENS) + b"data: [DONE]\n\n",
        _openai_chat(f"The code is {MARKER}.", 99) + b"data: [DONE]\n\n",
    ),
    "openai-completions": (
        CompletionStreamReader,
        _openai_completions(ANSWER, PROMPT_TOKENS) + b"data: [DONE]\n\n",
        _openai_completions(f"The code is {MARKER}.", 99),
    ),
    "anthropic": (
        AnthropicStreamReader,
        _anthropic(ANSWER, PROMPT_TOKENS) + _sse({"type": "message_stop"}, "message_stop"),
        _anthropic(f"The code is {MARKER}.", 99),
    ),
    "tgi-generate": (TGIStreamReader, _tgi(ANSWER, PROMPT_TOKENS), _tgi(MARKER, 99)),
    "ollama": (NDJSONReader, _ollama(ANSWER, PROMPT_TOKENS), _ollama(MARKER, 99)),
}


def _read(make: Callable[[Exchange], StreamAccumulator], chunks: list[bytes]) -> Exchange:
    """Feed chunks as the adapter does: no further read once the reader is done."""
    ex = Exchange(status=200, streamed=True)
    reader = make(ex)
    for chunk in chunks:
        reader.feed(chunk)
        if reader.done:
            break
    reader.finish()
    return ex


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_text_after_the_terminator_in_the_same_read_is_not_part_of_the_answer(name: str) -> None:
    """Answer, usage and termination are those sent before the terminator; the rest is counted."""
    make, answer, after = STREAMS[name]
    ex = _read(make, [answer + after])
    assert ex.answer == ANSWER
    assert ex.prompt_tokens == PROMPT_TOKENS
    assert ex.stream_terminated and ex.body_parsed, ex.error_detail
    assert ex.events_after_terminator >= 1


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_where_the_bytes_after_the_terminator_are_split_changes_no_fact(name: str) -> None:
    """Whatever read the bytes after the terminator arrive in, the facts are the same."""
    make, answer, after = STREAMS[name]
    whole = answer + after
    expected = _read(make, [answer])
    for cut in range(1, len(whole)):
        ex = _read(make, [whole[:cut], whole[cut:]])
        assert (ex.answer, ex.prompt_tokens, ex.stream_terminated, ex.body_parsed) == (
            expected.answer,
            expected.prompt_tokens,
            expected.stream_terminated,
            expected.body_parsed,
        ), cut
