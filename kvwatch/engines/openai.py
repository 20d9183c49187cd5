"""The OpenAI-compatible adapter: chat completions (streaming or not), tokenize, discovery.

This is the common case (vLLM, SGLang, llama.cpp server, TGI's Messages API, LiteLLM, hosted
APIs). It reports what came back as an :class:`~kvwatch.canary.model.Exchange` and never
raises for HTTP or transport failures: a refused connection, a stalled prefill, a cut stream
or an error frame are all facts a verdict is made of.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

import httpx

from kvwatch.canary.model import Exchange, Message, Rejection, TransportError
from kvwatch.canary.sizing import AcceptanceRule
from kvwatch.engines.base import Discovery, EngineAuthError, ProgressCallback, identity_of
from kvwatch.engines.http import (
    DEFAULT_BODY_LIMIT,
    BodyTooLarge,
    Stopwatch,
    bounded_text,
    classify_transport_error,
    describe_transport_error,
    iter_body,
    one_line,
    progress_ticks,
    read_capped,
    read_prefix,
)
from kvwatch.engines.rejections import (
    classify_rejection,
    error_message,
    is_context_length_payload,
)
from kvwatch.engines.sse import SSEDecodeError, SSEParser
from kvwatch.engines.tokenids import parse_tokenize_reply
from kvwatch.limits import EXCHANGE_ERROR_CHARS

TokenizeShape = Literal["vllm", "llamacpp"]

# What talking to an engine can raise that is a fact about the engine or the network, not a
# bug here. InvalidURL and StreamError are not HTTPError subclasses in httpx.
_TRANSPORT_FAILURES: tuple[type[BaseException], ...] = (
    httpx.HTTPError,
    httpx.InvalidURL,
    httpx.StreamError,
    TimeoutError,
    BodyTooLarge,
)
_CHAT_FAILURES: tuple[type[BaseException], ...] = (*_TRANSPORT_FAILURES, SSEDecodeError)

# The answer of a canary is a few tokens; anything past this is kept out of memory.
ANSWER_CHARS = 256 * 1024
# Tokenize calls are concurrent per piece but bounded, so a vocabulary of filler pieces does
# not open hundreds of connections to the engine at once.
TOKENIZE_CONCURRENCY = 8
# A tokenize reply lists every token id: about 7 MB of JSON for a 1M-token prompt on vLLM or
# llama.cpp. It is the engine's answer to our own request, so it gets a cap of its own rather
# than the chat body cap.
TOKENIZE_BODY_LIMIT = 256 * 1024 * 1024
# No window comes near 2**40 tokens; a reported count beyond it (or below 0) is garbage.
MAX_TOKEN_COUNT = 2**40
_USERINFO = re.compile(r"(\w+://)[^/@\s]+@")


class EngineCallError(Exception):
    """A helper call (tokenize, discovery) failed in transport or with an unexpected status;
    the message is one line, safe to log (it never holds the API key)."""


@dataclass(frozen=True, slots=True)
class Completion:
    """What a 2xx body said, parsed; ``problem`` explains why it is not a completion."""

    answer: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_prompt_tokens: int | None = None  # as Exchange.cached_prompt_tokens
    problem: str | None = None
    error_payload: Any = None
    unusable_usage: str | None = None  # as Exchange.unusable_usage


def parse_completion(payload: Any) -> Completion:
    """Read a non-streamed chat completion body (already JSON-decoded). Pure."""
    if not isinstance(payload, dict):
        return Completion(problem=f"2xx body is a JSON {type(payload).__name__}, not an object")
    if payload.get("error"):
        said = error_message(payload) or "no message"
        return Completion(
            problem=one_line(f"2xx body carries an error object: {said}"),
            error_payload=payload,
        )
    prompt_tokens, completion_tokens, unusable = _usage(payload.get("usage"))
    return replace(
        _first_choice(payload.get("choices")),
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_prompt_tokens=cached_tokens_of(payload.get("usage")),
        unusable_usage=unusable,
    )


def _first_choice(choices: Any) -> Completion:
    if not isinstance(choices, list):
        return Completion(problem="2xx body has no choices array")
    if not choices:
        return Completion(problem="2xx body has an empty choices array")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        return Completion(problem="choices[0] has no message object")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        return Completion(
            problem=f"choices[0].message.content is a {type(content).__name__}, not a string"
        )
    finish = choice.get("finish_reason")
    return Completion(
        # A null content (the model produced nothing visible) is an empty answer, not a
        # malformed body: the marker is then missing, which is the finding.
        answer=(content or "")[:ANSWER_CHARS],
        finish_reason=finish if isinstance(finish, str) else None,
    )


def _usage(usage: Any) -> tuple[int | None, int | None, str | None]:
    """Prompt and completion tokens of an OpenAI ``usage`` object, and what in it is no count."""
    if usage is None:
        return None, None, None
    if not isinstance(usage, dict):
        return None, None, f"usage {shown(usage)}"
    prompt, bad_prompt = token_count(usage.get("prompt_tokens"), "usage.prompt_tokens")
    completion, bad = token_count(usage.get("completion_tokens"), "usage.completion_tokens")
    return prompt, completion, bad_prompt or bad


def cached_tokens_of(usage: Any) -> int | None:
    """The prompt tokens an OpenAI-compatible ``usage`` says were served from the prefix
    cache (``prompt_tokens_details.cached_tokens``), or None when it does not say. vLLM
    writes the details only when started with ``--enable-prompt-tokens-details`` and the
    count is not zero (``if self.enable_prompt_tokens_details and num_cached_tokens``,
    vllm/entrypoints/openai/serving_chat.py); SGLang only with ``--enable-cache-report``;
    llama.cpp's server always (from ``n_prompt_tokens_cache``). So absent is never read as
    0: the caller decides what an engine that does not say means. A value that is no count
    is None too (the prompt count's own check reports bad usage). Pure."""
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, dict):
        return None
    count, bad = token_count(details.get("cached_tokens"), "cached_tokens")
    return None if bad is not None else count


def json_int(value: Any) -> int | None:
    """``value`` if it is a JSON integer (a bool is not one), else None. Pure."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def positive_int(value: Any) -> int | None:
    """``value`` if it is a JSON integer above zero, else None. Pure."""
    number = json_int(value)
    return number if number is not None and number > 0 else None


def token_count(value: Any, field: str) -> tuple[int | None, str | None]:
    """A token count the engine reported under ``field``: ``(count, None)``; ``(None, None)``
    when it reported none (absent, null); ``(None, "<field> <value>")`` when what it sent is no
    count (negative, fractional, a string, a bool, past any window). Not reading such a value
    as "no usage" keeps what the engine said as evidence, and the verdict off a pass. Pure."""
    if value is None:
        return None, None
    count = json_int(value)
    if count is not None and 0 <= count <= MAX_TOKEN_COUNT:
        return count, None
    return None, f"{field} {shown(value)}"


def shown(value: Any) -> str:
    """A reported value as the engine sent it (JSON), short enough for a reason. Pure."""
    if json_int(value) is not None and abs(value) >= 10**15:
        return f"{value:.3e}"
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:40] + "…"


def reject_implausible_usage(exchange: Exchange) -> None:
    """Drop token counts no engine can mean (negative, or past any real window), keeping what
    was reported as ``unusable_usage``.

    Every adapter's body parsing ends here, after counts were added up (Anthropic's cached
    prompt tokens). A count like 10**30 would also overflow the store's 64-bit column and lose
    the whole probe, so it must not leave the adapter. Pure."""
    for name in ("prompt_tokens", "completion_tokens"):
        value = getattr(exchange, name)
        if value is None or 0 <= value <= MAX_TOKEN_COUNT:
            continue
        setattr(exchange, name, None)
        if exchange.unusable_usage is None:
            exchange.unusable_usage = f"{name} {shown(value)}"


class StreamAccumulator(Protocol):
    """Turns a streamed body into Exchange facts, chunk by chunk; one per API flavour."""

    @property
    def done(self) -> bool: ...

    def feed(self, data: bytes) -> None: ...

    def finish(self) -> None: ...


def plain_prompt(messages: Sequence[Message]) -> str:
    """The text sent to raw-prompt APIs (OpenAI completions, TGI ``/generate``): the messages'
    contents, blank-line separated, without any chat template. Tokenize counts use the same
    text, so the plan still matches what the engine reads."""
    return "\n\n".join(m.content for m in messages)


class StreamReader:
    """Accumulates an OpenAI chat-completion SSE stream into an Exchange. Pure (no I/O)."""

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.parser = SSEParser()
        self.chunks = 0
        self._answer: list[str] = []
        self._answer_chars = 0

    @property
    def done(self) -> bool:
        return self.parser.done

    def feed(self, data: bytes) -> None:
        for event in self.parser.feed(data):
            self._event(event.data, event.event)

    def finish(self) -> None:
        for event in self.parser.close():
            self._event(event.data, event.event)
        ex = self.exchange
        ex.stream_terminated = self.parser.done
        ex.events_after_terminator = self.parser.after_done
        ex.answer = "".join(self._answer)
        if ex.stream_error_frame:
            ex.body_parsed = False
        elif ex.error_detail is None:
            if not self.parser.done:
                state = "inside an event" if self.parser.cut_mid_event else "between events"
                ex.error_detail = f"stream ended without [DONE] ({state}, {self.chunks} chunks)"
            ex.body_parsed = self.chunks > 0
            if self.chunks == 0 and ex.error_detail is None:
                ex.error_detail = "stream ended with [DONE] but carried no completion chunk"

    def _event(self, data: str, name: str | None) -> None:
        ex = self.exchange
        try:
            payload: Any = json.loads(data)
        except ValueError:
            if ex.error_detail is None:
                ex.error_detail = one_line(f"SSE frame is not JSON: {data}")
            ex.body_parsed = False
            return
        if name == "error" or (isinstance(payload, dict) and payload.get("error")):
            self._error_frame(payload)
            return
        if not isinstance(payload, dict):
            if ex.error_detail is None:
                ex.error_detail = f"SSE frame is a JSON {type(payload).__name__}, not an object"
            return
        self.chunks += 1
        prompt_tokens, completion_tokens, unusable = _usage(payload.get("usage"))
        if unusable is not None and ex.unusable_usage is None:
            ex.unusable_usage = unusable
        if prompt_tokens is not None:
            ex.prompt_tokens = prompt_tokens
        cached = cached_tokens_of(payload.get("usage"))
        if cached is not None:
            ex.cached_prompt_tokens = cached
        if completion_tokens is not None:
            ex.completion_tokens = completion_tokens
        choices = payload.get("choices")
        if not isinstance(choices, list):
            return
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                content = delta.get("content")
                if isinstance(content, str) and self._answer_chars < ANSWER_CHARS:
                    piece = content[: ANSWER_CHARS - self._answer_chars]
                    self._answer.append(piece)
                    self._answer_chars += len(piece)
            finish = choice.get("finish_reason")
            if isinstance(finish, str):
                ex.finish_reason = finish

    def _error_frame(self, payload: Any) -> None:
        ex = self.exchange
        ex.stream_error_frame = True
        ex.body_parsed = False
        text = json.dumps(payload)
        if ex.error_body is None:
            ex.error_body = bounded_text(text, EXCHANGE_ERROR_CHARS)
        ex.rejection = (
            Rejection.CONTEXT_LENGTH if is_context_length_payload(payload) else Rejection.OTHER
        )
        message = error_message(payload) or text
        ex.error_detail = one_line(f"error frame in a 2xx stream: {message}")


class OpenAIEngine:
    """An OpenAI-compatible endpoint. ``base_url`` is the API base (usually ending in ``/v1``);
    the engine root, where vLLM and llama.cpp serve ``/tokenize``, is that URL without it.

    Subclasses for other engines set the class attributes; the ``rule``, ``flavour`` and
    ``tokenize_shape`` arguments override them for one instance (``None``: the class's)."""

    # Which engine this is (discovery, tokenize dialect and admission rule follow from it).
    FLAVOUR: str = "openai"
    # When the engine rejects a prompt for its length; see kvwatch.canary.sizing.
    RULE: AcceptanceRule = AcceptanceRule.PROMPT_PLUS_MAX_TOKENS
    # Whether the engine refuses a prompt over its window. False for an engine documented to
    # cut such a prompt to fit instead (Ollama): its over probe can then only show the cut
    # (over_truncated), never a refusal, and check-config says so.
    HARD_LIMIT: bool = True
    # The tokenize dialect if the engine is known to speak one; None: found on first use.
    TOKENIZE_SHAPE: TokenizeShape | None = None

    def __init__(
        self,
        client: httpx.AsyncClient,
        *,
        base_url: str,
        model: str,
        api_key: str | None,
        body_limit_bytes: int = DEFAULT_BODY_LIMIT,
        rule: AcceptanceRule | None = None,
        flavour: str | None = None,
        tokenize_shape: TokenizeShape | None = None,
        tokenize_timeout: float = 300.0,
        progress_interval: float = 5.0,
    ) -> None:
        self._client = client
        self.base_url = base_url.rstrip("/")
        self.root_url = self.base_url.removesuffix("/v1")
        self.model = model
        self._api_key = api_key
        self.body_limit_bytes = body_limit_bytes
        self.rule = self.RULE if rule is None else rule
        self.hard_limit = self.HARD_LIMIT
        self.flavour = self.FLAVOUR if flavour is None else flavour
        # Which tokenize dialect the engine speaks; found on first use unless configured.
        shape = self.TOKENIZE_SHAPE if tokenize_shape is None else tokenize_shape
        self.tokenize_shape: TokenizeShape | None = shape
        self._shape_pinned = shape is not None
        self.tokenize_timeout = tokenize_timeout
        self.progress_interval = progress_interval

    def __repr__(self) -> str:  # never show the key
        return (
            f"OpenAIEngine(flavour={self.flavour!r}, base_url={self.base_url!r}, "
            f"model={self.model!r})"
        )

    # -- chat -------------------------------------------------------------------------------

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        stream: bool,
        timeout: float,
        progress: ProgressCallback | None = None,
        hang_up_after_first_chunk: bool = False,
    ) -> Exchange:
        body = self._chat_body(messages, max_tokens=max_tokens, stream=stream)
        exchange = Exchange(streamed=stream)
        clock = Stopwatch()
        try:
            # One deadline for the whole exchange (a 1M-token prefill may take minutes); the
            # httpx timeouts are the same number so none of them fires earlier than it.
            async with (
                asyncio.timeout(timeout),
                progress_ticks(progress, clock, interval=self.progress_interval),
            ):
                await self._exchange(
                    body, stream, exchange, clock, timeout, hang_up_after_first_chunk
                )
        except _CHAT_FAILURES as exc:
            self._transport_failure(exchange, exc, timeout)
        reject_implausible_usage(exchange)
        exchange.ttfb_seconds = clock.ttfb
        exchange.total_seconds = clock.elapsed()
        return exchange

    # -- what subclasses for other API flavours override ------------------------------------

    def _chat_url(self, *, stream: bool) -> str:
        return f"{self.base_url}/chat/completions"

    def _chat_body(
        self, messages: Sequence[Message], *, max_tokens: int, stream: bool
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    def _stream_reader(self, exchange: Exchange) -> StreamAccumulator:
        return StreamReader(exchange)

    def _is_stream_response(self, content_type: str) -> bool:
        return "text/event-stream" in content_type

    def _parse_completion(self, payload: Any, headers: httpx.Headers) -> Completion:
        return parse_completion(payload)

    # -- the exchange -----------------------------------------------------------------------

    async def _exchange(
        self,
        body: dict[str, Any],
        stream: bool,
        exchange: Exchange,
        clock: Stopwatch,
        deadline: float,
        hang_up: bool = False,
    ) -> None:
        request = self._client.build_request(
            "POST",
            self._chat_url(stream=stream),
            json=body,
            headers=self._headers(stream=stream),
            timeout=httpx.Timeout(deadline),
        )
        # A canary is judged as the configured endpoint's answer, so it is never re-sent to
        # wherever a redirect points: a 307 to another host would page (or pass) on behalf
        # of a server nobody configured. The redirect itself is what gets reported.
        response = await self._client.send(request, stream=True, follow_redirects=False)
        try:
            exchange.status = response.status_code
            if not response.is_success:
                raw = await read_prefix(response, min(self.body_limit_bytes, 64 * 1024))
                clock.mark_first_byte()
                exchange.error_body = bounded_text(raw, EXCHANGE_ERROR_CHARS)
                exchange.rejection = classify_rejection(response.status_code, raw)
                summary = self._error_summary(raw)
                if response.is_redirect:
                    where = self._scrub(response.headers.get("location", "nowhere"))
                    summary = f"redirected to {where}; canaries do not follow redirects"
                exchange.error_detail = one_line(f"HTTP {response.status_code}: {summary}")
                return
            content_type = response.headers.get("content-type", "")
            if stream and self._is_stream_response(content_type):
                await self._read_stream(response, exchange, clock, hang_up)
            else:
                # Also the path of an engine that ignores stream=true and answers in JSON:
                # what came back was not streamed, and is read as what it is.
                exchange.streamed = False
                raw = await read_capped(response, self.body_limit_bytes, clock)
                clock.mark_first_byte()
                self._read_completion(raw, exchange, response.headers)
        finally:
            await response.aclose()

    async def _read_stream(
        self, response: httpx.Response, exchange: Exchange, clock: Stopwatch, hang_up: bool
    ) -> None:
        reader = self._stream_reader(exchange)
        size = 0
        try:
            async for chunk in iter_body(response):
                if not chunk:
                    continue
                clock.mark_first_byte()
                size += len(chunk)
                if size > self.body_limit_bytes:
                    raise BodyTooLarge(self.body_limit_bytes)
                reader.feed(chunk)
                if hang_up:
                    # The cache probe's abort: the connection is closed (response.aclose)
                    # with the answer begun, so the engine aborts a request whose prompt it
                    # has already prefilled; what arrived is kept.
                    break
                if reader.done:
                    # The reader ignores anything after the terminator, in this read or any
                    # later one; reading on could only wait for a peer that does not stop.
                    break
        finally:
            # Even a cut stream keeps what arrived: a partial answer is evidence.
            reader.finish()

    def _read_completion(self, raw: bytes, exchange: Exchange, headers: httpx.Headers) -> None:
        try:
            payload = json.loads(raw)
        except ValueError:
            exchange.body_parsed = False
            exchange.error_body = bounded_text(raw, EXCHANGE_ERROR_CHARS)
            exchange.error_detail = one_line(
                f"2xx body is not JSON ({len(raw)} bytes): {raw[:120].decode('utf-8', 'replace')}"
            )
            return
        parsed = self._parse_completion(payload, headers)
        exchange.prompt_tokens = parsed.prompt_tokens
        exchange.completion_tokens = parsed.completion_tokens
        exchange.cached_prompt_tokens = parsed.cached_prompt_tokens
        exchange.unusable_usage = parsed.unusable_usage
        exchange.finish_reason = parsed.finish_reason
        if parsed.problem is not None:
            exchange.body_parsed = False
            exchange.error_detail = parsed.problem
            if parsed.error_payload is not None:
                exchange.error_body = bounded_text(raw, EXCHANGE_ERROR_CHARS)
                exchange.rejection = (
                    Rejection.CONTEXT_LENGTH
                    if is_context_length_payload(parsed.error_payload)
                    else Rejection.OTHER
                )
            return
        exchange.answer = parsed.answer
        exchange.body_parsed = True

    def _transport_failure(self, exchange: Exchange, exc: BaseException, timeout: float) -> None:
        if isinstance(exc, SSEDecodeError):
            exchange.transport_error = TransportError.PROTOCOL
            exchange.error_detail = one_line(f"protocol: {exc}")
        else:
            exchange.transport_error = classify_transport_error(exc)
            exchange.error_detail = self._scrub(describe_transport_error(exc, deadline=timeout))
        if exchange.streamed:
            exchange.stream_terminated = False
        exchange.body_parsed = False

    def _error_summary(self, raw: bytes) -> str:
        try:
            message = error_message(json.loads(raw))
        except ValueError:
            message = None
        return message or raw[:200].decode("utf-8", errors="replace") or "(empty body)"

    def _headers(self, *, stream: bool = False) -> dict[str, str]:
        headers = {"Accept": "text/event-stream" if stream else "application/json"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def _scrub(self, text: str) -> str:
        # Transport messages can echo a URL; a key pasted into one, or a password in its
        # user-info part, must not reach a log.
        if self._api_key:
            text = text.replace(self._api_key, "***")
        return _USERINFO.sub(r"\1***@", text)

    # -- helper calls -----------------------------------------------------------------------

    async def _post_json(
        self, path: str, body: dict[str, Any], *, base: str | None = None
    ) -> tuple[int, Any]:
        """POST to the engine root (or ``base``); returns (status, parsed JSON or None), as
        :meth:`_post_raw`."""
        status, raw = await self._post_raw(path, body, base=base)
        return status, _json_or_none(raw)

    async def _post_tokenize(self, path: str, body: dict[str, Any]) -> tuple[int, Any, int | None]:
        """POST a tokenize request: (status, the reply's JSON with its ``"tokens"`` ids left
        out, how many integer ids there were or None), as :meth:`_post_raw`, without
        building a Python int per token (kvwatch/engines/tokenids.py)."""
        status, raw = await self._post_raw(path, body)
        payload, ids = parse_tokenize_reply(raw)
        return status, payload, ids

    async def _post_raw(
        self, path: str, body: dict[str, Any], *, base: str | None = None
    ) -> tuple[int, bytes]:
        """POST to the engine root (or ``base``) with a tokenize reply's body limit; returns
        (status, body). 401/403 raise :class:`EngineAuthError`, transport failures
        :class:`EngineCallError`."""
        url = f"{self.root_url if base is None else base}{path}"
        limit = max(self.body_limit_bytes, TOKENIZE_BODY_LIMIT)
        status, raw = await self._call_raw("POST", url, body, limit)
        if status in (401, 403):
            # Not "no tokenize endpoint": the key is wrong, and that is what to report.
            raise EngineAuthError(f"POST {url}: HTTP {status}, credentials refused")
        return status, raw

    async def _discovery_call(
        self, method: str, url: str, body: dict[str, Any] | None = None
    ) -> tuple[int, Any, bytes]:
        """A discovery request: (status, parsed JSON or None, raw body). 401/403 raise
        :class:`EngineAuthError` (a config problem to report as such); transport failures
        raise :class:`EngineCallError`."""
        status, raw = await self._call_raw(method, url, body, self.body_limit_bytes)
        if status in (401, 403):
            raise EngineAuthError(f"{method} {url}: HTTP {status}, credentials refused")
        return status, _json_or_none(raw), raw

    async def _call(
        self, method: str, url: str, body: dict[str, Any] | None, limit: int
    ) -> tuple[int, Any]:
        status, raw = await self._call_raw(method, url, body, limit)
        return status, _json_or_none(raw)

    async def _call_raw(
        self, method: str, url: str, body: dict[str, Any] | None, limit: int
    ) -> tuple[int, bytes]:
        try:
            async with asyncio.timeout(self.tokenize_timeout):
                request = self._client.build_request(
                    method,
                    url,
                    json=body,
                    headers=self._headers(),
                    timeout=httpx.Timeout(self.tokenize_timeout),
                )
                response = await self._client.send(request, stream=True)
                try:
                    raw = await read_capped(response, limit)
                finally:
                    await response.aclose()
        except _TRANSPORT_FAILURES as exc:
            detail = describe_transport_error(exc, deadline=self.tokenize_timeout)
            raise EngineCallError(self._scrub(f"{method} {url}: {detail}")) from exc
        return response.status_code, raw

    async def _tokenize_vllm_chat(self, messages: Sequence[Message]) -> int | None:
        status, payload, _ = await self._post_tokenize(
            "/tokenize",
            {
                "model": self.model,
                "messages": [{"role": m.role, "content": m.content} for m in messages],
                "add_generation_prompt": True,
            },
        )
        if status == 200 and isinstance(payload, dict):
            return json_int(payload.get("count"))
        return None

    async def _tokenize_llamacpp_chat(self, messages: Sequence[Message]) -> int | None:
        status, payload = await self._post_json(
            "/apply-template",
            {"messages": [{"role": m.role, "content": m.content} for m in messages]},
        )
        if status != 200 or not isinstance(payload, dict):
            return None
        prompt = payload.get("prompt")
        if not isinstance(prompt, str):
            return None
        # The chat endpoint tokenizes the templated prompt with special tokens (BOS) added.
        return await self._tokenize_llamacpp_text(prompt, add_special=True)

    async def _tokenize_llamacpp_text(self, text: str, *, add_special: bool) -> int | None:
        status, payload, ids = await self._post_tokenize(
            "/tokenize", {"content": text, "add_special": add_special}
        )
        if status != 200 or not isinstance(payload, dict):
            return None
        if ids is not None:
            return ids
        # Not plain ids (e.g. with pieces): one entry per token all the same.
        tokens = payload.get("tokens")
        return len(tokens) if isinstance(tokens, list) else None

    async def _tokenize_vllm_text(self, text: str) -> int | None:
        status, payload, _ = await self._post_tokenize(
            "/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False}
        )
        if status == 200 and isinstance(payload, dict):
            return json_int(payload.get("count"))
        return None

    async def count_prompt_tokens(self, messages: Sequence[Message]) -> int | None:
        """The engine's own count of the templated prompt: vLLM's ``/tokenize`` with
        ``messages`` first, else llama.cpp's ``/apply-template`` + ``/tokenize``. The dialect
        that worked is remembered. ``None`` when neither exists; :class:`EngineCallError` when
        the engine could not be reached."""
        if self.tokenize_shape == "vllm":
            count = await self._tokenize_vllm_chat(messages)
        elif self.tokenize_shape == "llamacpp":
            count = await self._tokenize_llamacpp_chat(messages)
        else:
            count = None
        if count is not None or self._shape_pinned:
            return count
        # Unknown dialect, or the remembered one stopped working (the engine was replaced):
        # find it again.
        self.tokenize_shape = None
        count = await self._tokenize_vllm_chat(messages)
        if count is not None:
            self.tokenize_shape = "vllm"
            return count
        count = await self._tokenize_llamacpp_chat(messages)
        if count is not None:
            self.tokenize_shape = "llamacpp"
        return count

    async def count_text_tokens(self, texts: Sequence[str]) -> list[int] | None:
        """Raw token counts of each text (no template, no special tokens), a few requests at
        a time. ``None`` when the engine has no tokenize endpoint."""
        if not texts:
            return []
        if self.tokenize_shape is None:
            first = await self._detect_text_shape(texts[0])
            if first is None:
                return None
            rest = await self._count_texts(texts[1:])
            return None if rest is None else [first, *rest]
        return await self._count_texts(texts)

    async def _detect_text_shape(self, text: str) -> int | None:
        count = await self._tokenize_vllm_text(text)
        if count is not None:
            self.tokenize_shape = "vllm"
            return count
        count = await self._tokenize_llamacpp_text(text, add_special=False)
        if count is not None:
            self.tokenize_shape = "llamacpp"
        return count

    async def _count_texts(self, texts: Sequence[str]) -> list[int] | None:
        gate = asyncio.Semaphore(TOKENIZE_CONCURRENCY)

        async def one(text: str) -> int | None:
            async with gate:
                if self.tokenize_shape == "llamacpp":
                    return await self._tokenize_llamacpp_text(text, add_special=False)
                return await self._tokenize_vllm_text(text)

        counts = await asyncio.gather(*(one(text) for text in texts))
        if any(count is None for count in counts):
            return None
        return [count for count in counts if count is not None]

    # -- discovery --------------------------------------------------------------------------

    async def discover(self) -> Discovery:
        """Read the advertised window from ``GET /models`` (vLLM's ``max_model_len``).
        Never raises: what could not be learnt is said in ``detail``."""
        try:
            status, payload = await self._call(
                "GET", f"{self.base_url}/models", None, self.body_limit_bytes
            )
        except EngineCallError as exc:
            return Discovery(detail=str(exc))
        if status != 200:
            return Discovery(detail=f"GET /models answered {status}")
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, list):
            return Discovery(detail="GET /models: no data array")
        cards = [card for card in data if isinstance(card, dict)]
        card = next((c for c in cards if c.get("id") == self.model), None)
        if card is None:
            if len(cards) != 1:
                served = ", ".join(str(c.get("id")) for c in cards) or "none"
                return Discovery(detail=f"model {self.model!r} not listed; served: {served}")
            card = cards[0]
        model_id = card.get("id")
        window = json_int(card.get("max_model_len"))
        return Discovery(
            context_window=window if window is not None and window > 0 else None,
            model=model_id if isinstance(model_id, str) else None,
            detail=None if window is not None else "GET /models reports no max_model_len",
            # vLLM's ModelCard.root is the weights it loaded (the path or repo behind a served
            # name): a new checkpoint under the same served name changes it
            # (vllm/entrypoints/openai/protocol.py ModelCard).
            identity=identity_of(model_root=card.get("root")),
        )


def _json_or_none(raw: bytes) -> Any:
    """A body's JSON, or None when it is empty or not JSON (the caller says what it lacked)."""
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None
