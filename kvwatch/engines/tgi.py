"""Hugging Face TGI: the Messages API (OpenAI-compatible chat), discovery from ``/info``,
tokenize, and the native ``/generate`` / ``/generate_stream`` API as an extra flavour.

Sources (router/src/server.rs, router/src/lib.rs, router/src/validation.rs):
- ``GET /info`` → ``Info{model_id, max_input_tokens, max_total_tokens, ...}``;
- ``POST /tokenize`` ``{"inputs": text}`` → a list of ``{id, text, start, stop}`` (special
  tokens included, as for generation); ``POST /chat_tokenize`` (a chat request) →
  ``ChatTokenizeResponse{tokenize_response, templated_text}``;
- ``POST /generate`` ``{"inputs", "parameters": {"max_new_tokens", "details"}}`` →
  ``{generated_text, details: {finish_reason, generated_tokens, ...}}`` with the prompt size in
  the ``x-prompt-tokens`` response header; ``/generate_stream`` sends SSE ``StreamResponse``
  events ``{token: {text, special}, generated_text, details}`` whose last one has
  ``generated_text`` and ``details`` (``input_length`` in recent releases); no ``[DONE]``.
- Validation errors are 422 ``{"error": "Input validation error: ...", "error_type":
  "validation"}``: ``inputs`` tokens + ``max_new_tokens`` must be <= ``max_total_tokens``, and
  ``inputs`` at most ``max_input_tokens``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import httpx

from kvwatch.canary.model import Exchange, Message, Rejection
from kvwatch.canary.sizing import AcceptanceRule
from kvwatch.engines.base import Discovery, identity_of
from kvwatch.engines.http import bounded_text, one_line
from kvwatch.engines.openai import (
    ANSWER_CHARS,
    Completion,
    EngineCallError,
    OpenAIEngine,
    StreamAccumulator,
    plain_prompt,
    positive_int,
    shown,
    token_count,
)
from kvwatch.engines.rejections import error_message, is_context_length_payload
from kvwatch.engines.sse import EventStreamReader, SSEEvent
from kvwatch.limits import EXCHANGE_ERROR_CHARS


class TGIEngine(OpenAIEngine):
    """TGI through its Messages API (``/v1/chat/completions``)."""

    FLAVOUR = "tgi"
    # Validation refuses inputs + max_new_tokens > max_total_tokens (module docstring).
    RULE = AcceptanceRule.PROMPT_PLUS_MAX_TOKENS

    def __init__(self, client: httpx.AsyncClient, **options: Any) -> None:
        super().__init__(client, **options)
        # Tokens /tokenize adds to any text (BOS and the like), learnt on first use.
        self._special_tokens: int | None = None

    async def _tgi_tokenize(self, text: str) -> int | None:
        status, payload = await self._post_json("/tokenize", {"inputs": text})
        if status == 200 and isinstance(payload, list):
            return len(payload)
        return None

    async def count_prompt_tokens(self, messages: Sequence[Message]) -> int | None:
        status, payload = await self._post_json(
            "/chat_tokenize",
            {
                "model": self.model,
                "messages": [{"role": m.role, "content": m.content} for m in messages],
            },
        )
        if status == 200 and isinstance(payload, dict):
            tokens = payload.get("tokenize_response")
            if isinstance(tokens, list):
                return len(tokens)
        return None

    async def count_text_tokens(self, texts: Sequence[str]) -> list[int] | None:
        if self._special_tokens is None:
            empty = await self._tgi_tokenize("")
            if empty is None:
                return None
            self._special_tokens = empty
        counts: list[int] = []
        for text in texts:
            count = await self._tgi_tokenize(text)
            if count is None:
                return None
            counts.append(count - self._special_tokens)
        return counts

    async def discover(self) -> Discovery:
        try:
            status, info, _ = await self._discovery_call("GET", f"{self.root_url}/info")
        except EngineCallError as exc:
            return Discovery(detail=str(exc))
        if status != 200 or not isinstance(info, dict):
            return Discovery(detail=f"GET /info answered {status}")
        total = positive_int(info.get("max_total_tokens"))
        max_input = positive_int(info.get("max_input_tokens"))
        model = info.get("model_id")
        detail = None if total is not None else "GET /info reports no max_total_tokens"
        if max_input is not None:
            # An under probe larger than this is refused whatever the window says.
            detail = "; ".join(x for x in (detail, f"max_input_tokens {max_input}") if x)
        return Discovery(
            context_window=total,
            # TGI reports no per-request KV pool (max_batch_total_tokens is a batch budget).
            kv_pool_tokens=None,
            model=model if isinstance(model, str) else None,
            detail=detail,
            max_prompt_tokens=max_input,
            # The router's Info (router/src/lib.rs): its release and commit (version, sha)
            # and the weights' revision (model_sha); model_id and the limits are above.
            identity=identity_of(
                version=info.get("version"),
                sha=info.get("sha"),
                model_sha=info.get("model_sha"),
                max_input_tokens=max_input,
            ),
        )


class TGIStreamReader(EventStreamReader):
    """Accumulates a TGI ``/generate_stream`` SSE stream. Pure (no I/O)."""

    def __init__(self, exchange: Exchange) -> None:
        super().__init__(exchange)
        self.events = 0

    def _is_last(self, event: SSEEvent) -> bool:
        # The final StreamResponse is the one with generated_text; an error frame is not it.
        try:
            payload: Any = json.loads(event.data)
        except ValueError:
            return False
        return (
            isinstance(payload, dict)
            and event.event != "error"
            and not payload.get("error")
            and payload.get("generated_text") is not None
        )

    def _missing_end(self) -> str:
        return f"stream ended without its final event ({self.events} events)"

    def _event(self, data: str, name: str | None) -> None:
        ex = self.exchange
        try:
            payload: Any = json.loads(data)
        except ValueError:
            ex.error_detail = ex.error_detail or one_line(f"SSE frame is not JSON: {data}")
            return
        if not isinstance(payload, dict):
            return
        if name == "error" or payload.get("error"):
            ex.stream_error_frame = True
            ex.body_parsed = False
            ex.error_body = ex.error_body or bounded_text(data, EXCHANGE_ERROR_CHARS)
            ex.rejection = (
                Rejection.CONTEXT_LENGTH if is_context_length_payload(payload) else Rejection.OTHER
            )
            said = error_message(payload) or data
            ex.error_detail = one_line(f"error frame in a 2xx stream: {said}")
            return
        self.events += 1
        token = payload.get("token")
        if isinstance(token, dict) and not token.get("special"):
            text = token.get("text")
            if isinstance(text, str) and self._chars < ANSWER_CHARS:
                self._answer.append(text[: ANSWER_CHARS - self._chars])
                self._chars += len(text)
        details = payload.get("details")
        if isinstance(details, dict):
            _read_details(details, ex)


def _read_details(details: dict[str, Any], ex: Exchange) -> None:
    finish = details.get("finish_reason")
    if isinstance(finish, str):
        ex.finish_reason = finish
    generated, bad_generated = token_count(
        details.get("generated_tokens"), "details.generated_tokens"
    )
    if generated is not None:
        ex.completion_tokens = generated
    prompt, bad_prompt = token_count(details.get("input_length"), "details.input_length")
    if prompt is not None:
        ex.prompt_tokens = prompt
    ex.unusable_usage = ex.unusable_usage or bad_prompt or bad_generated


def _prompt_header(headers: httpx.Headers) -> tuple[int | None, str | None]:
    """The prompt size /generate reports in its ``x-prompt-tokens`` header."""
    value = headers.get("x-prompt-tokens", "").strip()
    if not value:
        return None, None
    if value.isascii() and value.isdigit():
        return token_count(int(value), "x-prompt-tokens")
    return None, f"x-prompt-tokens {shown(value)}"


class TGIGenerateEngine(TGIEngine):
    """TGI's native ``/generate`` API: a raw prompt (no chat template) and its own shapes."""

    def _chat_url(self, *, stream: bool) -> str:
        return f"{self.root_url}/generate_stream" if stream else f"{self.root_url}/generate"

    def _chat_body(
        self, messages: Sequence[Message], *, max_tokens: int, stream: bool
    ) -> dict[str, Any]:
        return {
            "inputs": plain_prompt(messages),
            "parameters": {"max_new_tokens": max_tokens, "details": True, "do_sample": False},
        }

    def _stream_reader(self, exchange: Exchange) -> StreamAccumulator:
        return TGIStreamReader(exchange)

    def _parse_completion(self, payload: Any, headers: httpx.Headers) -> Completion:
        if isinstance(payload, list) and len(payload) == 1:
            payload = payload[0]  # the compat route answers a one-element list
        prompt_tokens, unusable = _prompt_header(headers)
        if not isinstance(payload, dict):
            return Completion(problem="2xx body is not a generation object")
        if payload.get("error"):
            said = error_message(payload) or "no message"
            return Completion(
                problem=one_line(f"2xx body carries an error: {said}"), error_payload=payload
            )
        text = payload.get("generated_text")
        if not isinstance(text, str):
            return Completion(
                prompt_tokens=prompt_tokens,
                unusable_usage=unusable,
                problem="2xx body has no generated_text",
            )
        probe = Exchange()
        details = payload.get("details")
        if isinstance(details, dict):
            _read_details(details, probe)
        return Completion(
            answer=text[:ANSWER_CHARS],
            finish_reason=probe.finish_reason,
            prompt_tokens=prompt_tokens if prompt_tokens is not None else probe.prompt_tokens,
            completion_tokens=probe.completion_tokens,
            unusable_usage=unusable or probe.unusable_usage,
        )

    async def count_prompt_tokens(self, messages: Sequence[Message]) -> int | None:
        # /generate reads the raw prompt with special tokens added, as /tokenize counts it.
        return await self._tgi_tokenize(plain_prompt(messages))
