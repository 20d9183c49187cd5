"""OpenAI completions (``POST /v1/completions``): a raw prompt instead of chat messages.

Served by vLLM, SGLang, llama.cpp and TGI alike (OpenAI API reference, "Completions";
vllm/entrypoints/openai/protocol.py ``CompletionRequest`` / ``CompletionResponse``). The answer
is ``choices[0].text``; streamed chunks carry ``choices[0].text`` deltas and, with
``stream_options.include_usage``, a last chunk with ``usage``; the stream ends with
``data: [DONE]``. The prompt is the messages' plain text (no chat template), and it is counted
as the engine tokenizes a completion prompt: special tokens (BOS) included.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import httpx

from kvwatch.canary.model import Exchange, Message
from kvwatch.engines.openai import (
    ANSWER_CHARS,
    Completion,
    OpenAIEngine,
    StreamAccumulator,
    StreamReader,
    parse_completion,
    plain_prompt,
)


def as_chat_payload(payload: Any) -> Any:
    """A completion body or chunk rewritten as its chat equivalent, so one parser reads both:
    ``choices[i].text`` becomes ``message.content`` (or ``delta.content`` in a stream)."""
    if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list):
        return payload
    choices = []
    for choice in payload["choices"]:
        if isinstance(choice, dict) and "text" in choice:
            text = choice.get("text")
            choice = {
                **choice,
                "message": {"role": "assistant", "content": text},
                "delta": {"content": text},
            }
        choices.append(choice)
    return {**payload, "choices": choices}


class CompletionStreamReader(StreamReader):
    def _event(self, data: str, name: str | None) -> None:
        try:
            payload = json.loads(data)
        except ValueError:
            super()._event(data, name)
            return
        super()._event(json.dumps(as_chat_payload(payload)), name)


class OpenAICompletionsEngine(OpenAIEngine):
    def _chat_url(self, *, stream: bool) -> str:
        return f"{self.base_url}/completions"

    def _chat_body(
        self, messages: Sequence[Message], *, max_tokens: int, stream: bool
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": plain_prompt(messages),
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def _stream_reader(self, exchange: Exchange) -> StreamAccumulator:
        return CompletionStreamReader(exchange)

    def _parse_completion(self, payload: Any, headers: httpx.Headers) -> Completion:
        parsed = parse_completion(as_chat_payload(payload))
        if parsed.answer is not None:
            return replace(parsed, answer=parsed.answer[:ANSWER_CHARS])
        return parsed

    async def count_prompt_tokens(self, messages: Sequence[Message]) -> int | None:
        text = plain_prompt(messages)
        if self.tokenize_shape in (None, "vllm"):
            status, payload, _ = await self._post_tokenize(
                "/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": True}
            )
            if (
                status == 200
                and isinstance(payload, dict)
                and isinstance(payload.get("count"), int)
            ):
                self.tokenize_shape = "vllm"
                return int(payload["count"])
        count = await self._tokenize_llamacpp_text(text, add_special=True)
        if count is not None:
            self.tokenize_shape = "llamacpp"
        return count
