"""Helpers for the simulator's tests: exactly sized canary prompts and SSE parsing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from kvwatch.canary.model import Message
from kvwatch.simulator import tokenizer
from kvwatch.simulator.model import render_chat

QUESTION = " What is the code given at the start? Answer with the code only."


def sized_messages(prompt_tokens: int, marker: str | None = None) -> tuple[Message, ...]:
    """One user message whose templated prompt is exactly ``prompt_tokens`` simulator tokens.

    Filler words are single tokens (a space and up to eight letters) and sit between a period
    and a space-led question, so each one adds exactly one token.
    """
    head = f"Remember this code: {marker}." if marker else "There is no code here."
    base = tokenizer.count(render_chat([Message("user", head + QUESTION)]))
    if prompt_tokens < base:
        raise ValueError(f"{prompt_tokens} tokens cannot hold the canary ({base} minimum)")
    words = ("lorem", "ipsum", "dolor", "amet", "magna", "aliqua")
    filler = "".join(f" {words[i % len(words)]}" for i in range(prompt_tokens - base))
    messages = (Message("user", head + filler + QUESTION),)
    assert tokenizer.count(render_chat(messages)) == prompt_tokens
    return messages


def as_json(messages: Sequence[Message]) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in messages]


def chat_body(
    prompt_tokens: int,
    marker: str | None = None,
    *,
    max_tokens: int = 16,
    stream: bool = False,
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "sim-1",
        "messages": as_json(sized_messages(prompt_tokens, marker)),
        "max_tokens": max_tokens,
        "stream": stream,
        **extra,
    }
    if stream:
        body.setdefault("stream_options", {"include_usage": True})
    return body


def sse_payloads(text: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order."""
    return [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]


def answer_text(response: Any) -> str:
    """The assistant's text of a completion, streamed (joined deltas) or not."""
    if response.headers["content-type"].startswith("text/event-stream"):
        frames = [json.loads(p) for p in sse_payloads(response.text) if p != "[DONE]"]
        return "".join(
            choice["delta"].get("content") or ""
            for frame in frames
            for choice in frame.get("choices", [])
        )
    return str(response.json()["choices"][0]["message"]["content"])
