"""Proxy mode: the simulator's faults injected in front of a real engine.

Each endpoint ``NAME`` is served under ``/NAME/`` like the simulator's, but every request goes
to one real engine (``upstream``: its root URL, e.g. llama-server's ``http://host:port``), and
the endpoint's :class:`FaultMode` changes the request or the reply on the way. So each fault
verdict can be shown against a real model's answers, not only the simulator's own "model".

What each fault does here (prompt sizes are the upstream's own count, ``/apply-template`` then
``/tokenize`` with ``add_special``, the llama.cpp dialect; the simulator speaks it too):

- ``stale_kv``: a prompt over ``kv_pool`` is not sent; the upstream gets the last prompt this
  endpoint served whole (the "stale pages") or, with none yet, an empty one-message chat (the
  placeholder). The real model answers from that other request's text, so it repeats the
  *other* marker, and usage reports 1 prompt token (the placeholder the incident swapped in).
  Requests are told apart by the credential they present (``Authorization`` / ``x-api-key``):
  the stale prompt served is the last one *another* tenant sent, when there is one, so a
  tenant is answered from another tenant's cached prefix.
- ``truncate_head`` / ``truncate_tail``: a prompt over ``kv_pool`` keeps the last / first
  ``kv_pool`` tokens. The cut is made on the upstream's own token pieces of the last message
  (``/tokenize`` ``with_pieces``), so the templated prompt lands on ``kv_pool`` give or take
  the few tokens the re-joined text re-merges into.
- ``accept_over_limit``: an upstream context-length rejection is retried with the prompt's
  first ``min(kv_pool, window - max_tokens)`` tokens (``window`` from the endpoint's spec), so
  the client gets the real model's 200.
- ``wrong_status``: an upstream context-length rejection becomes a generic 500.
- ``stream_error_frame``: a streamed prompt over ``kv_pool`` is forwarded cut to its first
  ``kv_pool`` tokens (what the pool held), the real model's first content chunk is relayed,
  then an error frame and ``[DONE]`` end the stream. Not streamed, it is answered 500 without
  reaching the upstream.

- ``batch_mix`` (``batch_mix_how: swap`` only): a request joins the endpoint's batch and
  waits one batch step; with ``batch_mix_at`` or more requests in flight then, it is sent to
  the upstream with the *next* request's prompt, so the client gets the real model's answer to
  another request (vLLM #6023: "responses from other requests"), HTTP 200. (``mix``, one
  answer carrying part of another's, has no real-model equivalent: refused at start.)

- ``prefix_collision``: the proxy keeps a prefix cache of the prompts it forwarded (the
  simulator's, 16-token blocks of the last message); a prompt that departs from a cached one
  after sharing its first part is forwarded with the earlier prompt's text past that point (as
  a colliding or stale entry would serve its pages), so the real model answers from the earlier
  document. The upstream's own cache and its usage report are left as they are.
- ``abort_reuse``: the same prefix cache, filled as the simulator fills it: a streamed
  request's blocks enter it before they are written and are completed only once its answer
  has been relayed whole, so a client that hangs up mid-answer leaves the later half of its
  blocks empty, and the next prompt that starts with that document is forwarded without
  that half (SGLang PR #28374: "later requests with the same prefix may reuse invalid cached
  KV"); the real model answers from what is left.

``report_usage: sent`` makes a cut or swapped prompt report the tokens sent instead of the
tokens the upstream read (an engine that lies about usage). Everything else (``/v1/models``,
``/tokenize``, ``/apply-template``, ``/props``, ``/slots``, ``/health``, ...) is passed through
unchanged, as is a request no fault applies to.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import re
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kvwatch.canary.model import Rejection
from kvwatch.engines.rejections import classify_rejection
from kvwatch.simulator import errors, tokenizer
from kvwatch.simulator.model import BATCH_STEP_SECONDS, PLACEHOLDER_TOKENS
from kvwatch.simulator.prefix import BLOCK_TOKENS, PrefixCache
from kvwatch.simulator.server import SHUTDOWN_GRACE_SECONDS, _bind, _EmbeddedServer
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from kvwatch.simulator.traces import TRACE_HEADERS

PROXY_FAULTS = frozenset(
    {
        FaultMode.HEALTHY,
        FaultMode.STALE_KV,
        FaultMode.TRUNCATE_HEAD,
        FaultMode.TRUNCATE_TAIL,
        FaultMode.ACCEPT_OVER_LIMIT,
        FaultMode.STREAM_ERROR_FRAME,
        FaultMode.WRONG_STATUS,
        FaultMode.BATCH_MIX,
        FaultMode.PREFIX_COLLISION,
        FaultMode.ABORT_REUSE,
    }
)
# Faults that need the prompt's size before anything is sent.
_POOL_FAULTS = frozenset(
    {
        FaultMode.STALE_KV,
        FaultMode.TRUNCATE_HEAD,
        FaultMode.TRUNCATE_TAIL,
        FaultMode.STREAM_ERROR_FRAME,
    }
)
# Request headers worth passing on; hop-by-hop ones and the length (re-computed) are not.
# The trace headers go on too, as a gateway's would: the engine's spans must join the trace
# of the probe that caused them, whatever fault the proxy played in between.
_FORWARDED_HEADERS = ("authorization", "x-api-key", "content-type", "accept", *TRACE_HEADERS)
_FRAME_END = re.compile(rb"\r?\n\r?\n")
_DONE = b"data: [DONE]\n\n"

Messages = list[dict[str, Any]]
# prefix_collision: blocks of forwarded prompts the proxy keeps (16 tokens each: 1M tokens).
PROXY_CACHE_BLOCKS = 65_536


class ProxyError(Exception):
    """A request the proxy cannot fault as asked (answered 400 to the client)."""


def check_proxy_fault(endpoint: SimEndpoint) -> None:
    """Raise ``ValueError`` when ``endpoint``'s fault has no proxy-mode equivalent."""
    if endpoint.fault is FaultMode.BATCH_MIX and endpoint.batch_mix_how != "swap":
        raise ValueError(
            f"endpoint {endpoint.name}: batch_mix_how {endpoint.batch_mix_how} is not available "
            "in proxy mode (a real model's answer cannot be made half another's); use swap"
        )
    if endpoint.fault not in PROXY_FAULTS:
        supported = ", ".join(sorted(f.value for f in PROXY_FAULTS))
        raise ValueError(
            f"endpoint {endpoint.name}: fault {endpoint.fault.value} is not available in proxy "
            f"mode (a real model cannot be made to forget, throttle or fail on cue); use one "
            f"of: {supported}"
        )


@dataclass(slots=True)
class ProxyStats:
    requests: int = 0
    forwarded: int = 0
    injected: int = 0  # requests a fault changed

    def as_dict(self) -> dict[str, int]:
        return {"requests": self.requests, "forwarded": self.forwarded, "injected": self.injected}


@dataclass(slots=True)
class ProxyEndpoint:
    """One proxied endpoint's state: its fault, its stale prompt, its counters."""

    spec: SimEndpoint
    fault: FaultMode
    # The last prompt each tenant (by its credential; "" for none) had served whole, oldest
    # first: what the stale pages hold.
    stale_by_tenant: dict[str, Messages] = field(default_factory=dict)
    stats: ProxyStats = field(default_factory=ProxyStats)
    # batch_mix: the prompts of the requests in flight, in arrival order (each its own list).
    in_flight: list[Messages] = field(default_factory=list)
    # prefix_collision, abort_reuse: the prompts forwarded, as a prefix cache holds them.
    prefix: PrefixCache = field(default_factory=lambda: PrefixCache(PROXY_CACHE_BLOCKS))

    def leave(self, messages: Messages) -> None:
        """A batch_mix request is done: it leaves the batch."""
        self.in_flight[:] = [m for m in self.in_flight if m is not messages]

    def remember(self, tenant: str, messages: Messages) -> None:
        self.stale_by_tenant.pop(tenant, None)  # re-inserted: the newest goes last
        self.stale_by_tenant[tenant] = messages

    def stale_for(self, tenant: str) -> Messages | None:
        """The newest prompt another tenant had served, else the newest of any tenant."""
        newest_first = list(reversed(self.stale_by_tenant.items()))
        for owner, messages in newest_first:
            if owner != tenant:
                return messages
        return newest_first[0][1] if newest_first else None


class Upstream:
    """The real engine: passes requests on and counts prompts in its own tokens."""

    def __init__(self, root_url: str, client: httpx.AsyncClient) -> None:
        self.root_url = root_url.rstrip("/").removesuffix("/v1")
        self.client = client

    async def count_prompt(self, messages: Messages, headers: dict[str, str]) -> int:
        """Prompt tokens of a chat as the upstream counts them (template and BOS included)."""
        rendered = await self._post("/apply-template", {"messages": messages}, headers)
        prompt = rendered.get("prompt")
        if not isinstance(prompt, str):
            raise ProxyError("upstream /apply-template answered without a prompt")
        return len(await self._tokens(prompt, headers, add_special=True))

    async def pieces(self, text: str, headers: dict[str, str]) -> list[str]:
        """``text`` as the upstream's token pieces, which concatenate back to ``text``."""
        tokens = await self._tokens(text, headers, add_special=False, with_pieces=True)
        out = [t.get("piece") for t in tokens if isinstance(t, dict)]
        if len(out) != len(tokens) or not all(isinstance(p, str) for p in out):
            raise ProxyError("upstream /tokenize gave no text pieces (with_pieces)")
        return [p for p in out if isinstance(p, str)]

    async def _tokens(self, text: str, headers: dict[str, str], **options: bool) -> list[Any]:
        body = await self._post("/tokenize", {"content": text, **options}, headers)
        tokens = body.get("tokens")
        if not isinstance(tokens, list):
            raise ProxyError("upstream /tokenize answered without tokens")
        return tokens

    async def _post(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
        reply = await self.client.post(f"{self.root_url}{path}", json=body, headers=headers)
        if reply.status_code != 200:
            raise ProxyError(f"upstream {path} answered {reply.status_code}")
        payload = reply.json()
        if not isinstance(payload, dict):
            raise ProxyError(f"upstream {path} answered with no JSON object")
        return payload


def _headers(request: Request) -> dict[str, str]:
    return {k: v for k in _FORWARDED_HEADERS if (v := request.headers.get(k)) is not None}


def _tenant(headers: dict[str, str]) -> str:
    """Who sent a request: the credential it presents, as is ("" without one)."""
    return headers.get("authorization") or headers.get("x-api-key") or ""


def _last_text(messages: Messages) -> tuple[int, str]:
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, dict) and isinstance(message.get("content"), str):
            return index, message["content"]
    raise ProxyError("proxy mode cuts prompts only in messages with string content")


def _replace_text(messages: Messages, index: int, text: str) -> Messages:
    out = [dict(m) for m in messages]
    out[index]["content"] = text
    return out


async def cut_prompt(
    upstream: Upstream,
    messages: Messages,
    *,
    sent: int,
    keep: int,
    keep_head: bool,
    headers: dict[str, str],
) -> Messages:
    """``messages`` with the last message cut so the prompt keeps about ``keep`` of ``sent``
    tokens: its first tokens when ``keep_head``, else its last."""
    index, text = _last_text(messages)
    pieces = await upstream.pieces(text, headers)
    drop = min(len(pieces), max(0, sent - keep))
    kept = pieces[: len(pieces) - drop] if keep_head else pieces[drop:]
    return _replace_text(messages, index, "".join(kept))


def _rewrite_usage(payload: Any, prompt_tokens: int) -> Any:
    """Make a completion (or chunk) report ``prompt_tokens``; drop timings that would not."""
    if not isinstance(payload, dict):
        return payload
    usage = payload.get("usage")
    if isinstance(usage, dict):
        completion = usage.get("completion_tokens")
        usage["prompt_tokens"] = prompt_tokens
        if isinstance(completion, int):
            usage["total_tokens"] = prompt_tokens + completion
        usage.pop("prompt_tokens_details", None)
    # llama.cpp's timings count what was prefilled: they would contradict the rewritten usage.
    payload.pop("timings", None)
    return payload


async def _frames(response: httpx.Response) -> AsyncIterator[bytes]:
    """The upstream's event stream split into whole frames (each without its blank line)."""
    buffer = b""
    async for chunk in response.aiter_bytes():
        buffer += chunk
        while (match := _FRAME_END.search(buffer)) is not None:
            yield buffer[: match.start()]
            buffer = buffer[match.end() :]
    if buffer.strip():
        yield buffer


def _frame_payload(frame: bytes) -> Any:
    data = b"\n".join(line[5:].lstrip() for line in frame.splitlines() if line.startswith(b"data:"))
    if not data or data == b"[DONE]":
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def _has_content(payload: Any) -> bool:
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list):
        return False
    return any(
        isinstance(c, dict) and isinstance(c.get("delta"), dict) and c["delta"].get("content")
        for c in choices
    )


class _Relay:
    """Streams an upstream reply to the client, optionally rewriting or cutting it."""

    def __init__(
        self,
        response: httpx.Response,
        *,
        rewrite: Callable[[Any], Any] | None = None,
        error_after_content: dict[str, Any] | None = None,
        on_complete: Callable[[], None] | None = None,
    ) -> None:
        self.response = response
        self.rewrite = rewrite
        self.error_after_content = error_after_content
        self.on_complete = on_complete  # the whole reply went out (not on a hang-up)

    async def __call__(self) -> AsyncIterator[bytes]:
        try:
            async for frame in _frames(self.response):
                payload = _frame_payload(frame)
                if payload is not None and self.rewrite is not None:
                    frame = b"data: " + json.dumps(self.rewrite(payload)).encode()
                yield frame + b"\n\n"
                if self.error_after_content is not None and _has_content(payload):
                    # The KV cache "runs out" once decoding has begun: 200, real tokens, then
                    # the engine's error frame; the upstream's remaining answer is dropped.
                    yield b"data: " + json.dumps(self.error_after_content).encode() + b"\n\n"
                    yield _DONE
                    return
            if self.on_complete is not None:
                self.on_complete()
        finally:
            await self.response.aclose()


def _usage(spec: SimEndpoint, sent: int, read: int | None) -> Callable[[Any], Any] | None:
    """What usage must show: the ``sent`` tokens when the endpoint lies about usage, else
    ``read`` (``None``: the upstream's own figure, which is what it read)."""
    value = sent if spec.report_usage == "sent" else read
    return None if value is None else (lambda payload: _rewrite_usage(payload, value))


class ProxyApp:
    """The ASGI app's logic: one instance per running proxy."""

    def __init__(self, upstream: Upstream, endpoints: Sequence[SimEndpoint]) -> None:
        self.upstream = upstream
        self.endpoints: dict[str, ProxyEndpoint] = {}
        for spec in endpoints:
            check_proxy_fault(spec)
            if spec.name in self.endpoints:
                raise ValueError(f"duplicate proxied endpoint name {spec.name!r}")
            self.endpoints[spec.name] = ProxyEndpoint(spec, spec.fault)

    def endpoint(self, request: Request) -> ProxyEndpoint:
        name = request.path_params["name"]
        state = self.endpoints.get(name)
        if state is None:
            raise ProxyError(f"no proxied endpoint named {name!r}")
        return state

    async def chat(self, request: Request) -> Response:
        try:
            state = self.endpoint(request)
        except ProxyError as exc:
            return JSONResponse({"error": {"message": str(exc), "code": 404}}, 404)
        state.stats.requests += 1
        raw = await request.body()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(body, dict) or not isinstance(messages, list) or not messages:
            # Nothing to fault: let the upstream answer the malformed request its own way.
            return await self._forward(request, "/v1/chat/completions", raw)
        try:
            return await self._chat(state, request, body, messages)
        except ProxyError as exc:
            error = errors.error_body(state.spec.flavour, 400, f"proxy: {exc}")
            return JSONResponse(error, 400)

    async def _chat(
        self, state: ProxyEndpoint, request: Request, body: dict[str, Any], messages: Messages
    ) -> Response:
        fault, headers = state.fault, _headers(request)
        if fault is FaultMode.BATCH_MIX:
            return await self._batched(state, body, messages, headers)
        if fault is FaultMode.PREFIX_COLLISION:
            body = _collided(state, body, messages)
        if fault is FaultMode.ABORT_REUSE:
            return await self._reusing(state, body, messages, headers)
        if fault in _POOL_FAULTS:
            sent = await self.upstream.count_prompt(messages, headers)
            if sent > state.spec.pool_tokens:
                return await self._beyond_pool(state, body, messages, headers, sent)
        reply = await self._send(body, headers, remember=state)
        if fault in (FaultMode.ACCEPT_OVER_LIMIT, FaultMode.WRONG_STATUS) and _is_context(reply):
            state.stats.injected += 1
            if fault is FaultMode.WRONG_STATUS:
                return JSONResponse(
                    errors.error_body(state.spec.flavour, 500, "Internal server error"), 500
                )
            return await self._past_the_limit(state, body, messages, headers)
        return reply

    async def _reusing(
        self,
        state: ProxyEndpoint,
        body: dict[str, Any],
        messages: Messages,
        headers: dict[str, str],
    ) -> Response:
        """abort_reuse: served what the prefix cache holds for the last message, then cached
        as the simulator caches it: a streamed request's later half stays empty until its
        answer has gone out whole."""
        pieces = _cacheable(messages)
        if pieces is None:
            return await self._send(body, headers, remember=state)
        served = _from_cache(state, body, messages, pieces, collide=False)
        streamed = body.get("stream") is True
        half = len(pieces) // BLOCK_TOKENS // 2
        state.prefix.insert(pieces, filled_blocks=half if streamed else None)
        complete = functools.partial(state.prefix.insert, pieces) if streamed else None
        return await self._send(served, headers, remember=state, on_complete=complete)

    async def _batched(
        self,
        state: ProxyEndpoint,
        body: dict[str, Any],
        messages: Messages,
        headers: dict[str, str],
    ) -> Response:
        """batch_mix: after a batch step, a batch of ``batch_mix_at`` or more answers each
        request from the next one's prompt."""
        mine = list(messages)  # its own list: found in the batch by identity
        state.in_flight.append(mine)
        try:
            await asyncio.sleep(BATCH_STEP_SECONDS)
            batch = list(state.in_flight)
            if len(batch) < state.spec.batch_mix_at:
                return await self._send(body, headers)
            position = next(i for i, m in enumerate(batch) if m is mine)
            state.stats.injected += 1
            return await self._send(
                body | {"messages": batch[(position + 1) % len(batch)]}, headers
            )
        finally:
            # Still in the batch for a decode step, as on the simulator: a request that
            # arrived a little later is batched with it too.
            asyncio.get_running_loop().call_later(BATCH_STEP_SECONDS, state.leave, mine)

    async def _beyond_pool(
        self,
        state: ProxyEndpoint,
        body: dict[str, Any],
        messages: Messages,
        headers: dict[str, str],
        sent: int,
    ) -> Response:
        """The pool fault's answer to a prompt of ``sent`` tokens, more than the pool holds."""
        spec, fault = state.spec, state.fault
        state.stats.injected += 1
        if fault is FaultMode.STALE_KV:
            # The stale pages: another request's prompt (another tenant's first), or nothing
            # worth recalling.
            stale = state.stale_for(_tenant(headers)) or [{"role": "user", "content": ""}]
            rewrite = _usage(spec, sent, PLACEHOLDER_TOKENS)
            return await self._send(body | {"messages": stale}, headers, rewrite)
        if fault is FaultMode.STREAM_ERROR_FRAME:
            return await self._kv_exhausted(state, body, messages, headers, sent)
        cut = await cut_prompt(
            self.upstream,
            messages,
            sent=sent,
            keep=spec.pool_tokens,
            keep_head=fault is FaultMode.TRUNCATE_TAIL,
            headers=headers,
        )
        return await self._send(body | {"messages": cut}, headers, _usage(spec, sent, None))

    async def _kv_exhausted(
        self,
        state: ProxyEndpoint,
        body: dict[str, Any],
        messages: Messages,
        headers: dict[str, str],
        sent: int,
    ) -> Response:
        """An engine out of KV blocks: a 500, or an error frame inside a started stream."""
        spec = state.spec
        message = (
            f"KV cache exhausted: cannot allocate blocks for {sent} prompt tokens "
            f"(the pool holds {spec.pool_tokens})"
        )
        if not body.get("stream"):
            return JSONResponse(errors.error_body(spec.flavour, 500, message), 500)
        frame = errors.stream_error_frame(spec.flavour, message)
        # The engine prefilled what its pool held and began decoding before it failed.
        cut = await cut_prompt(
            self.upstream,
            messages,
            sent=sent,
            keep=spec.pool_tokens,
            keep_head=True,
            headers=headers,
        )
        return await self._send(body | {"messages": cut}, headers, error_after_content=frame)

    async def _past_the_limit(
        self,
        state: ProxyEndpoint,
        body: dict[str, Any],
        messages: Messages,
        headers: dict[str, str],
    ) -> Response:
        """Serve a prompt the upstream refused as too long, as an engine that does not enforce
        its limit would: the head that fits, read as if it were the whole prompt."""
        spec = state.spec
        sent = await self.upstream.count_prompt(messages, headers)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        # The head that the KV pool holds and that leaves room for the answer under any
        # engine's admission rule.
        room = min(
            spec.pool_tokens, spec.window - (max_tokens if isinstance(max_tokens, int) else 1)
        )
        cut = await cut_prompt(
            self.upstream, messages, sent=sent, keep=room, keep_head=True, headers=headers
        )
        return await self._send(body | {"messages": cut}, headers, _usage(spec, sent, None))

    async def _send(
        self,
        body: dict[str, Any],
        headers: dict[str, str],
        rewrite: Callable[[Any], Any] | None = None,
        *,
        error_after_content: dict[str, Any] | None = None,
        remember: ProxyEndpoint | None = None,
        on_complete: Callable[[], None] | None = None,
    ) -> Response:
        """POST ``body`` to the upstream's chat completions; relay (and maybe alter) the reply.

        With ``remember``, a 200 reply makes this prompt that endpoint's stale pages.
        ``on_complete`` runs once a streamed reply has been relayed whole (never when the
        client hangs up first, nor for a reply that is not a stream).
        """
        url = f"{self.upstream.root_url}/v1/chat/completions"
        upstream_request = self.upstream.client.build_request(
            "POST", url, json=body, headers=headers
        )
        response = await self.upstream.client.send(upstream_request, stream=True)
        if remember is not None:
            remember.stats.forwarded += 1
            if response.status_code == 200:
                remember.remember(_tenant(headers), list(body["messages"]))
        content_type = response.headers.get("content-type", "application/json")
        if content_type.startswith("text/event-stream"):
            relay = _Relay(
                response,
                rewrite=rewrite,
                error_after_content=error_after_content,
                on_complete=on_complete,
            )
            return StreamingResponse(relay(), response.status_code, media_type="text/event-stream")
        try:
            raw = await response.aread()
        finally:
            await response.aclose()
        if rewrite is not None and response.status_code == 200:
            raw = json.dumps(rewrite(json.loads(raw))).encode()
        return Response(raw, response.status_code, media_type=content_type)

    async def passthrough(self, request: Request) -> Response:
        try:
            self.endpoint(request)
        except ProxyError as exc:
            return JSONResponse({"error": {"message": str(exc), "code": 404}}, 404)
        return await self._forward(request, "/" + request.path_params["path"], None)

    async def _forward(self, request: Request, path: str, body: bytes | None) -> Response:
        content = await request.body() if body is None else body
        reply = await self.upstream.client.request(
            request.method,
            f"{self.upstream.root_url}{path}",
            content=content or None,
            params=request.query_params,
            headers=_headers(request),
        )
        media = reply.headers.get("content-type", "application/json")
        return Response(reply.content, reply.status_code, media_type=media)

    async def set_fault(self, request: Request) -> Response:
        try:
            state = self.endpoint(request)
            fault = FaultMode(str(json.loads(await request.body()).get("fault")))
            check_proxy_fault(SimEndpoint(state.spec.name, fault=fault))
        except (ProxyError, ValueError, AttributeError) as exc:
            return JSONResponse({"error": {"message": str(exc), "code": 400}}, 400)
        state.fault = fault
        return JSONResponse({"name": state.spec.name, "fault": fault.value})

    async def stats(self, request: Request) -> Response:
        return JSONResponse(
            {
                name: {**state.stats.as_dict(), "fault": state.fault.value}
                for name, state in self.endpoints.items()
            }
        )


def _is_context(reply: Response) -> bool:
    """Whether a buffered upstream reply is a context-length rejection."""
    if isinstance(reply, StreamingResponse) or not 400 <= reply.status_code < 500:
        return False
    return classify_rejection(reply.status_code, bytes(reply.body)) is Rejection.CONTEXT_LENGTH


def build_proxy_app(upstream: Upstream, endpoints: Sequence[SimEndpoint]) -> Starlette:
    proxy = ProxyApp(upstream, endpoints)
    app = Starlette(
        routes=[
            Route("/_sim/stats", proxy.stats, methods=["GET"]),
            Route("/{name}/_sim/fault", proxy.set_fault, methods=["PUT"]),
            Route("/{name}/v1/chat/completions", proxy.chat, methods=["POST"]),
            Route("/{name}/{path:path}", proxy.passthrough, methods=["GET", "POST"]),
        ]
    )
    app.state.proxy = proxy
    return app


class RunningProxy:
    """A proxy serving on a real socket; ``url_for(name)`` is what kvwatch's ``url`` takes."""

    def __init__(self, proxy: ProxyApp, host: str, port: int) -> None:
        self.proxy = proxy
        self.host = host
        self.port = port

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def url_for(self, name: str) -> str:
        if name not in self.proxy.endpoints:
            raise KeyError(f"no proxied endpoint named {name!r}")
        return f"{self.base_url}/{name}/v1"

    @property
    def endpoints(self) -> list[SimEndpoint]:
        return [state.spec for state in self.proxy.endpoints.values()]

    def set_fault(self, name: str, fault: FaultMode | str) -> None:
        chosen = FaultMode(fault)
        check_proxy_fault(SimEndpoint(name, fault=chosen))
        self.proxy.endpoints[name].fault = chosen

    def stats(self) -> dict[str, dict[str, int]]:
        return {name: state.stats.as_dict() for name, state in self.proxy.endpoints.items()}


@contextlib.asynccontextmanager
async def run_proxy(
    upstream_url: str,
    endpoints: Sequence[SimEndpoint],
    host: str = "127.0.0.1",
    port: int = 0,
) -> AsyncIterator[RunningProxy]:
    """Serve ``endpoints`` in front of the engine at ``upstream_url`` until the block exits."""
    # No kept-alive upstream connections: llama-server may close one after a stream without
    # saying so, and the next request on it would fail (docs/llamacpp-facts.md).
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:
        upstream = Upstream(upstream_url, client)
        app = build_proxy_app(upstream, endpoints)
        sock = _bind(host, port)
        bound_port = sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_keep_alive=30,
            timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS,
        )
        server = _EmbeddedServer(config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError("proxy stopped before it started")
                await asyncio.sleep(0.01)
            yield RunningProxy(app.state.proxy, host, bound_port)
        finally:
            server.should_exit = True
            await task
            sock.close()


def _collided(state: ProxyEndpoint, body: dict[str, Any], messages: Messages) -> dict[str, Any]:
    """prefix_collision: the request with its last message as a colliding prefix cache
    serves it (the earlier prompt's text past the shared part); unchanged when nothing
    collides. The message is then cached as sent."""
    pieces = _cacheable(messages)
    if pieces is None:
        return body
    served = _from_cache(state, body, messages, pieces, collide=True)
    state.prefix.insert(pieces)
    return served


def _cacheable(messages: Messages) -> list[str] | None:
    """The last message's tokens (the simulator's), or None when it is not plain text."""
    last = messages[-1]
    content = last.get("content") if isinstance(last, dict) else None
    return tokenizer.tokenize(content) if isinstance(content, str) else None


def _from_cache(
    state: ProxyEndpoint,
    body: dict[str, Any],
    messages: Messages,
    pieces: list[str],
    *,
    collide: bool,
) -> dict[str, Any]:
    """The request with its last message as the prefix cache serves it: unchanged when the
    cache holds its text (or nothing of it), counted as injected when it does not."""
    hit = state.prefix.lookup(pieces, collide=collide)
    if hit.attended == "".join(pieces):
        return body
    state.stats.injected += 1
    return body | {"messages": [*messages[:-1], {**messages[-1], "content": hit.attended}]}
