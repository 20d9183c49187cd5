"""Anthropic's Messages API (``POST /v1/messages``) and its token counter.

Sources (docs.anthropic.com: "Messages", "Streaming Messages", "Token counting", "Errors"):
- headers ``x-api-key`` and ``anthropic-version: 2023-06-01``; system text goes in the
  top-level ``system`` field, not in ``messages``;
- the answer is the text blocks of ``content``; ``stop_reason`` is ``end_turn`` /
  ``max_tokens``; ``usage.input_tokens`` excludes prompt-cache reads and writes, which are
  reported as ``cache_read_input_tokens`` / ``cache_creation_input_tokens`` — the prompt is
  their sum;
- the stream is SSE with named events: ``message_start`` (``message.usage.input_tokens``),
  ``content_block_delta`` (``delta.text``), ``message_delta`` (``delta.stop_reason``,
  ``usage.output_tokens``), ``message_stop`` (the terminator), ``ping``, and ``error``
  (``{"type": "error", "error": {"type", "message"}}``, e.g. ``overloaded_error``);
- an over-long prompt is a 400 ``invalid_request_error`` "prompt is too long: N tokens > M
  maximum"; ``POST /v1/messages/count_tokens`` answers ``{"input_tokens": N}``;
- Anthropic reports no context window or KV pool: configure ``context_window``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import httpx

from kvwatch.canary.model import Exchange, Message, Rejection
from kvwatch.canary.sizing import AcceptanceRule
from kvwatch.engines.base import Discovery
from kvwatch.engines.http import bounded_text, one_line
from kvwatch.engines.openai import (
    ANSWER_CHARS,
    TOKENIZE_CONCURRENCY,
    Completion,
    EngineCallError,
    OpenAIEngine,
    StreamAccumulator,
    json_int,
    shown,
    token_count,
)
from kvwatch.engines.rejections import error_message, is_context_length_payload
from kvwatch.engines.sse import EventStreamReader, SSEEvent
from kvwatch.limits import EXCHANGE_ERROR_CHARS

ANTHROPIC_VERSION = "2023-06-01"


def prompt_tokens_of(usage: Any) -> tuple[int | None, str | None]:
    """Every prompt token the request carried, cached or not, and what in ``usage`` is no
    count (then the total is unknown: ``None``)."""
    if usage is None:
        return None, None
    if not isinstance(usage, dict):
        return None, f"usage {shown(usage)}"
    parts = [
        token_count(usage.get(k), f"usage.{k}")
        for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    ]
    unusable = next((bad for _, bad in parts if bad is not None), None)
    base = parts[0][0]
    if base is None or unusable is not None:
        return None, unusable
    return base + sum(count or 0 for count, _ in parts[1:]), None


def cache_read_of(usage: Any) -> int | None:
    """The prompt tokens Anthropic read from its prompt cache (``cache_read_input_tokens``),
    or None when the usage does not say (absent is not 0). Pure."""
    if not isinstance(usage, dict):
        return None
    count, bad = token_count(usage.get("cache_read_input_tokens"), "cache_read_input_tokens")
    return None if bad is not None else count


def _output_tokens(usage: Any) -> tuple[int | None, str | None]:
    if not isinstance(usage, dict):
        return None, None
    return token_count(usage.get("output_tokens"), "usage.output_tokens")


def split_system(messages: Sequence[Message]) -> tuple[str | None, list[dict[str, str]]]:
    system = "\n\n".join(m.content for m in messages if m.role == "system") or None
    turns = [{"role": m.role, "content": m.content} for m in messages if m.role != "system"]
    return system, turns


def parse_message(payload: Any) -> Completion:
    """A non-streamed Messages API body. Pure."""
    if not isinstance(payload, dict):
        return Completion(problem="2xx body is not a JSON object")
    if payload.get("type") == "error" or payload.get("error"):
        said = error_message(payload) or "no message"
        return Completion(
            problem=one_line(f"2xx body carries an error: {said}"), error_payload=payload
        )
    content = payload.get("content")
    if not isinstance(content, list):
        return Completion(problem="2xx body has no content array")
    text = "".join(
        block["text"]
        for block in content
        if isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
    )
    usage = payload.get("usage")
    stop = payload.get("stop_reason")
    prompt_tokens, bad_prompt = prompt_tokens_of(usage)
    completion_tokens, bad_completion = _output_tokens(usage)
    return Completion(
        answer=text[:ANSWER_CHARS],
        finish_reason=stop if isinstance(stop, str) else None,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_prompt_tokens=cache_read_of(usage),
        unusable_usage=bad_prompt or bad_completion,
    )


class AnthropicStreamReader(EventStreamReader):
    """Accumulates a Messages API event stream. Pure (no I/O)."""

    def __init__(self, exchange: Exchange) -> None:
        super().__init__(exchange)
        self._started = False

    def _is_last(self, event: SSEEvent) -> bool:
        # The event's own type decides, as in _event; the SSE event name only without one.
        try:
            payload: Any = json.loads(event.data)
        except ValueError:
            return False
        return isinstance(payload, dict) and payload.get("type", event.event) == "message_stop"

    def _completed(self) -> bool:
        return self._ended and self._started

    def _missing_end(self) -> str:
        return "stream ended without message_stop"

    def _event(self, data: str, name: str | None) -> None:
        ex = self.exchange
        try:
            payload: Any = json.loads(data)
        except ValueError:
            ex.error_detail = ex.error_detail or one_line(f"SSE frame is not JSON: {data}")
            return
        if not isinstance(payload, dict):
            return
        kind = payload.get("type", name)
        if kind == "error" or name == "error":
            ex.stream_error_frame = True
            ex.body_parsed = False
            ex.error_body = ex.error_body or bounded_text(data, EXCHANGE_ERROR_CHARS)
            ex.rejection = (
                Rejection.CONTEXT_LENGTH if is_context_length_payload(payload) else Rejection.OTHER
            )
            ex.error_detail = one_line(
                f"error event in a 2xx stream: {error_message(payload) or data}"
            )
            return
        if kind == "message_start":
            self._started = True
            message = payload.get("message")
            if isinstance(message, dict):
                ex.prompt_tokens, unusable = prompt_tokens_of(message.get("usage"))
                ex.cached_prompt_tokens = cache_read_of(message.get("usage"))
                ex.unusable_usage = ex.unusable_usage or unusable
        elif kind == "content_block_delta":
            delta = payload.get("delta")
            text = delta.get("text") if isinstance(delta, dict) else None
            if isinstance(text, str) and self._chars < ANSWER_CHARS:
                self._answer.append(text[: ANSWER_CHARS - self._chars])
                self._chars += len(text)
        elif kind == "message_delta":
            delta = payload.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                ex.finish_reason = delta["stop_reason"]
            usage = payload.get("usage")
            if isinstance(usage, dict):
                ex.completion_tokens, unusable = _output_tokens(usage)
                ex.unusable_usage = ex.unusable_usage or unusable


class AnthropicEngine(OpenAIEngine):
    FLAVOUR = "anthropic"
    RULE = AcceptanceRule.PROMPT_PLUS_MAX_TOKENS

    def __init__(self, client: httpx.AsyncClient, **options: Any) -> None:
        super().__init__(client, **options)
        # https://api.anthropic.com and https://api.anthropic.com/v1 both work as a URL.
        self.api_url = f"{self.root_url}/v1"
        self._overhead: int | None = None

    def _headers(self, *, stream: bool = False) -> dict[str, str]:
        headers = {
            "Accept": "text/event-stream" if stream else "application/json",
            "anthropic-version": ANTHROPIC_VERSION,
        }
        if self._api_key:
            headers["x-api-key"] = self._api_key
        return headers

    def _chat_url(self, *, stream: bool) -> str:
        return f"{self.api_url}/messages"

    def _chat_body(
        self, messages: Sequence[Message], *, max_tokens: int, stream: bool
    ) -> dict[str, Any]:
        system, turns = split_system(messages)
        body: dict[str, Any] = {
            "model": self.model,
            "messages": turns,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": stream,
        }
        if system is not None:
            body["system"] = system
        return body

    def _stream_reader(self, exchange: Exchange) -> StreamAccumulator:
        return AnthropicStreamReader(exchange)

    def _parse_completion(self, payload: Any, headers: httpx.Headers) -> Completion:
        return parse_message(payload)

    async def _count(self, messages: Sequence[Message]) -> int | None:
        system, turns = split_system(messages)
        body: dict[str, Any] = {"model": self.model, "messages": turns}
        if system is not None:
            body["system"] = system
        status, payload = await self._post_json("/messages/count_tokens", body, base=self.api_url)
        if status == 200 and isinstance(payload, dict):
            return json_int(payload.get("input_tokens"))
        return None

    async def count_prompt_tokens(self, messages: Sequence[Message]) -> int | None:
        return await self._count(messages)

    async def count_text_tokens(self, texts: Sequence[str]) -> list[int] | None:
        """Each text as a lone user turn, less the turn's own overhead (measured once with a
        one-token text). Anthropic calls its counts estimates: prefer ``tokenizer: usage``."""
        if not texts:
            return []
        if self._overhead is None:
            single = await self._count([Message("user", "a")])
            if single is None:
                return None
            self._overhead = single - 1
        overhead = self._overhead
        gate = asyncio.Semaphore(TOKENIZE_CONCURRENCY)

        async def one(text: str) -> int | None:
            async with gate:
                count = await self._count([Message("user", text)])
                return None if count is None else max(0, count - overhead)

        counts = await asyncio.gather(*(one(text) for text in texts))
        if any(c is None for c in counts):
            return None
        return [c for c in counts if c is not None]

    async def discover(self) -> Discovery:
        try:
            status, card, _ = await self._discovery_call(
                "GET", f"{self.api_url}/models/{self.model}"
            )
        except EngineCallError as exc:
            return Discovery(detail=str(exc))
        model = card.get("id") if isinstance(card, dict) else None
        note = "Anthropic reports no context window or KV pool: configure context_window"
        if status != 200:
            note = f"GET /v1/models/{self.model} answered {status}; {note}"
        return Discovery(model=model if isinstance(model, str) else None, detail=note)
