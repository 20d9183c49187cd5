"""Ollama's native API: ``/api/chat`` (JSON or NDJSON stream), ``/api/show`` and ``/api/ps``.

Sources (docs/api.md, api/types.go in ollama/ollama):
- ``POST /api/chat`` ``{model, messages, stream, options: {num_predict, temperature}}`` →
  ``{message: {role, content}, done, done_reason, prompt_eval_count, eval_count}``; streamed,
  one JSON object per line (``application/x-ndjson``), the last with ``done: true`` and the
  counts. Errors are ``{"error": "..."}`` (also as a stream line).
- Ollama does not reject a prompt over its context: ``truncate`` defaults to true on
  ``/api/chat``, and the runner (runner/llamarunner/runner.go ``NewSequence``) cuts a prompt
  of more than ``num_ctx`` tokens to ``num_ctx`` — the first ``num_keep`` tokens and the
  tail — logging "truncating input prompt". So the only evidence is ``prompt_eval_count``
  (tokens evaluated) falling short of the plan: ``truncated`` on *under*, ``over_truncated``
  (expected, info) on *over*. Some recent releases answer 400 "exceeds the available context
  size" for some models instead, which the over probe passes. Cached prefix tokens are not
  evaluated again either; canaries start with a fresh marker, so only a few template tokens
  can hit the cache (see docs/engines.md).
- ``POST /api/show {model}`` → ``model_info["<arch>.context_length"]`` (the model's trained
  maximum) and ``parameters`` (text, ``num_ctx N`` when the Modelfile sets it);
  ``GET /api/ps`` → ``models[].context_length``: the context the loaded runner really has.
- No tokenize endpoint: configure ``tokenizer: usage`` or a local tokenizer.
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
    json_int,
    token_count,
)
from kvwatch.engines.rejections import error_message, is_context_length_payload
from kvwatch.limits import EXCHANGE_ERROR_CHARS


def parse_ollama_chat(payload: Any) -> Completion:
    """A non-streamed ``/api/chat`` body. Pure."""
    if not isinstance(payload, dict):
        return Completion(problem="2xx body is not a JSON object")
    if payload.get("error"):
        said = error_message(payload) or "no message"
        return Completion(
            problem=one_line(f"2xx body carries an error: {said}"), error_payload=payload
        )
    message = payload.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
        return Completion(problem="2xx body has no message.content")
    reason = payload.get("done_reason")
    prompt_tokens, completion_tokens, unusable = _counts(payload)
    return Completion(
        answer=content[:ANSWER_CHARS],
        finish_reason=reason if isinstance(reason, str) else None,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        unusable_usage=unusable,
    )


def _counts(payload: dict[str, Any]) -> tuple[int | None, int | None, str | None]:
    """Prompt and answer tokens of a final ``/api/chat`` object, and what of them is no count."""
    prompt, bad_prompt = token_count(payload.get("prompt_eval_count"), "prompt_eval_count")
    completion, bad_completion = token_count(payload.get("eval_count"), "eval_count")
    return prompt, completion, bad_prompt or bad_completion


class NDJSONReader:
    """Accumulates an Ollama NDJSON stream. Pure (no I/O)."""

    def __init__(self, exchange: Exchange, *, max_line: int = 1 << 20) -> None:
        self.exchange = exchange
        self._buffer = b""
        self._answer: list[str] = []
        self._chars = 0
        self._done = False
        self._max_line = max_line
        self.lines = 0

    @property
    def done(self) -> bool:
        return self._done or self.exchange.stream_error_frame

    def feed(self, data: bytes) -> None:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            if line.strip():
                self._line(line)
        if len(self._buffer) > self._max_line:
            if self._done:
                # Past the done line nothing is read, however long.
                self.exchange.events_after_terminator += 1
            else:
                self.exchange.error_detail = f"NDJSON line longer than {self._max_line} bytes"
            self._buffer = b""

    def finish(self) -> None:
        if self._buffer.strip():
            self._line(self._buffer)
            self._buffer = b""
        ex = self.exchange
        ex.stream_terminated = self._done
        ex.answer = "".join(self._answer)
        if ex.stream_error_frame:
            ex.body_parsed = False
        elif ex.error_detail is None:
            if not self._done:
                ex.error_detail = f"stream ended without a done line ({self.lines} lines)"
            ex.body_parsed = self._done

    def _line(self, line: bytes) -> None:
        ex = self.exchange
        if self._done:
            # The done line ends the answer, in this read or a later one.
            ex.events_after_terminator += 1
            return
        try:
            payload: Any = json.loads(line)
        except ValueError:
            ex.error_detail = ex.error_detail or one_line(
                f"stream line is not JSON: {line[:120].decode('utf-8', 'replace')}"
            )
            return
        if not isinstance(payload, dict):
            return
        if payload.get("error"):
            ex.stream_error_frame = True
            ex.body_parsed = False
            ex.error_body = ex.error_body or bounded_text(line, EXCHANGE_ERROR_CHARS)
            ex.rejection = (
                Rejection.CONTEXT_LENGTH if is_context_length_payload(payload) else Rejection.OTHER
            )
            ex.error_detail = one_line(f"error line in a 2xx stream: {error_message(payload)}")
            return
        self.lines += 1
        message = payload.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str) and self._chars < ANSWER_CHARS:
            self._answer.append(content[: ANSWER_CHARS - self._chars])
            self._chars += len(content)
        if payload.get("done") is True:
            self._done = True
            reason = payload.get("done_reason")
            ex.finish_reason = reason if isinstance(reason, str) else ex.finish_reason
            ex.prompt_tokens, ex.completion_tokens, unusable = _counts(payload)
            ex.unusable_usage = ex.unusable_usage or unusable


class OllamaEngine(OpenAIEngine):
    FLAVOUR = "ollama"
    # Ollama truncates an over-long prompt instead of refusing it: *over* is sized at the
    # smallest prompt it cuts (window + 1) and judged on the cut (docs/engines.md).
    RULE = AcceptanceRule.PROMPT_UP_TO_WINDOW
    HARD_LIMIT = False

    def __init__(self, client: httpx.AsyncClient, **options: Any) -> None:
        super().__init__(client, **options)
        # The native API lives at the server root, whatever suffix the URL was given with.
        self.root_url = self.base_url.removesuffix("/v1").removesuffix("/api")

    def _chat_url(self, *, stream: bool) -> str:
        return f"{self.root_url}/api/chat"

    def _chat_body(
        self, messages: Sequence[Message], *, max_tokens: int, stream: bool
    ) -> dict[str, Any]:
        # num_ctx is left alone on purpose: setting it would reload the production model
        # with another context and probe a configuration nobody serves. So is `truncate`:
        # `truncate: false` would make this request fail where the clients' requests are cut,
        # and the over probe would prove a limit the clients never get.
        return {
            "model": self.model,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "stream": stream,
            "options": {"num_predict": max_tokens, "temperature": 0},
        }

    def _is_stream_response(self, content_type: str) -> bool:
        return "ndjson" in content_type or "json-seq" in content_type

    def _stream_reader(self, exchange: Exchange) -> StreamAccumulator:
        return NDJSONReader(exchange)

    def _parse_completion(self, payload: Any, headers: httpx.Headers) -> Completion:
        return parse_ollama_chat(payload)

    async def count_prompt_tokens(self, messages: Sequence[Message]) -> int | None:
        return None  # Ollama has no tokenize endpoint

    async def count_text_tokens(self, texts: Sequence[str]) -> list[int] | None:
        return None

    async def discover(self) -> Discovery:
        notes: list[str] = []
        trained: int | None = None
        num_ctx: int | None = None
        try:
            status, show, _ = await self._discovery_call(
                "POST", f"{self.root_url}/api/show", {"model": self.model}
            )
            if status == 200 and isinstance(show, dict):
                info = show.get("model_info")
                if isinstance(info, dict):
                    trained = next(
                        (
                            v
                            for k, v in info.items()
                            if k.endswith(".context_length") and json_int(v)
                        ),
                        None,
                    )
                params = show.get("parameters")
                if isinstance(params, str):
                    for line in params.splitlines():
                        name, _, value = line.strip().partition(" ")
                        if name == "num_ctx" and value.strip().isdigit():
                            num_ctx = int(value.strip())
            else:
                notes.append(f"POST /api/show answered {status}")
            status, ps, _ = await self._discovery_call("GET", f"{self.root_url}/api/ps")
        except EngineCallError as exc:
            return Discovery(model=self.model, detail=str(exc))
        loaded: int | None = None
        digest: object = None
        if status == 200 and isinstance(ps, dict) and isinstance(ps.get("models"), list):
            for entry in ps["models"]:
                if isinstance(entry, dict) and self.model in (
                    entry.get("name"),
                    entry.get("model"),
                ):
                    loaded = json_int(entry.get("context_length"))
                    # The loaded weights (docs/api.md "List Running Models"): a re-pulled
                    # tag changes it. expires_at and size_vram move with use: not identity.
                    digest = entry.get("digest")
        if trained is not None:
            notes.append(f"model trained for {trained} tokens")
        window = loaded or num_ctx
        if window is None:
            notes.append("model not loaded and no num_ctx set: Ollama's default context applies")
        return Discovery(
            context_window=window,
            model=self.model,
            detail="; ".join(notes) or None,
            identity=identity_of(version=await self._version(), digest=digest),
        )

    async def _version(self) -> object:
        # GET /api/version answers {"version": "0.x.y"} (docs/api.md "Version").
        try:
            status, payload, _ = await self._discovery_call("GET", f"{self.root_url}/api/version")
        except EngineCallError:
            return None
        return payload.get("version") if status == 200 and isinstance(payload, dict) else None
