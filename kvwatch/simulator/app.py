"""The simulator's HTTP face: one Starlette app serving every endpoint under ``/NAME/``.

Per endpoint, ``/NAME/v1/...`` is the OpenAI-compatible API (what users put in kvwatch's
``url``) and ``/NAME/tokenize``, ``/NAME/apply-template``, ``/NAME/health`` sit at the engine
root, where vLLM and llama.cpp serve them. ``/_sim/stats`` and ``/NAME/_sim/fault`` are the
control API for tests and game days. All decisions are made by :mod:`kvwatch.simulator.model`;
this module parses requests and renders decisions in the engines' wire shapes.

Shapes follow: vLLM ``TokenizeChatRequest`` / ``TokenizeCompletionRequest`` /
``TokenizeResponse{count, max_model_len, tokens, token_strs}`` and ``ModelCard.max_model_len``
(vllm/entrypoints/openai/protocol.py); llama.cpp ``/tokenize`` ``{content, add_special,
with_pieces}`` → ``{tokens}`` and ``/apply-template`` ``{messages}`` → ``{prompt}``
(tools/server/README.md, tools/server/tests/unit/test_tokenize.py); OpenAI chat completion and
chunk objects with ``stream_options.include_usage`` (a last chunk with empty ``choices`` and
``usage``, then ``data: [DONE]``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kvwatch.simulator import errors, listing, native
from kvwatch.simulator.model import (
    BATCH_STEP_SECONDS,
    Answer,
    ChatRequest,
    EndpointState,
    Reject,
    Simulation,
    StreamFailure,
    render_chat,
)
from kvwatch.simulator.requests import (
    _authorised,
    _BadRequest,
    _endpoint,
    _error,
    _json_object,
    _max_tokens,
    _messages,
    _sse,
    _usage,
    credential,
)
from kvwatch.simulator.spec import FaultMode, Flavour
from kvwatch.simulator.traces import RecordTraces, traces_route

_DONE = b"data: [DONE]\n\n"
# abort_reuse: one decode step per answer token, long enough for a disconnect to be seen.
DECODE_STEP_SECONDS = 0.05


class _Chunks:
    """Builds ``chat.completion.chunk`` objects sharing one id, like a real stream."""

    def __init__(self, model: str) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model

    def chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [
                {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            ],
        }

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage,
        }


async def _answer_stream(
    model: str,
    answer: Answer,
    include_usage: bool,
    decode_step: float = 0.0,
    done: Callable[[], None] | None = None,
) -> AsyncIterator[bytes]:
    chunks = _Chunks(model)
    yield _sse(chunks.chunk({"role": "assistant", "content": ""}))
    for piece in answer.pieces:
        if decode_step:
            await asyncio.sleep(decode_step)
        yield _sse(chunks.chunk({"content": piece}))
    # Reached only when every piece was sent: a client that hung up stopped the stream at
    # the yield it could not take.
    if done is not None:
        done()
    yield _sse(chunks.chunk({}, answer.finish_reason))
    if include_usage:
        yield _sse(chunks.usage_chunk(_usage(answer)))
    yield _DONE


async def _failing_stream(model: str, failure: StreamFailure) -> AsyncIterator[bytes]:
    chunks = _Chunks(model)
    yield _sse(chunks.chunk({"role": "assistant", "content": ""}))
    yield _sse(failure.error)
    yield _DONE


def _completion(model: str, answer: Answer) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": answer.text},
                "logprobs": None,
                "finish_reason": answer.finish_reason,
            }
        ],
        "usage": _usage(answer),
    }


async def chat_completions(request: Request) -> Response:
    state = _endpoint(request)
    spec = state.spec
    if not _authorised(state, request):
        state.stats.requests += 1
        state.stats.rejected += 1
        return JSONResponse(errors.unauthorized(), 401)
    try:
        body = await _json_object(request)
        model = body.get("model")
        if model is not None and model != spec.model:
            return _error(state, 404, f"The model `{model}` does not exist.", "model")
        chat = ChatRequest(
            messages=_messages(body.get("messages")),
            max_tokens=_max_tokens(body),
            stream=bool(body.get("stream", False)),
            tenant=credential(state, request),
        )
    except _BadRequest as exc:
        return _error(state, 400, str(exc), exc.param)
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))

    decision = state.handle(chat)
    if isinstance(decision, Reject):
        return JSONResponse(decision.body, decision.status, headers=decision.headers)

    # Prefill happens before the first byte; sleeping (never blocking) keeps every other
    # endpoint of the fleet responsive meanwhile. The request is in the engine's running
    # batch from now until a decode step after its answer is decided.
    flight = state.arrive(decision)
    try:
        delay = spec.ttfb_delay
        if spec.prefill_tokens_per_second > 0:
            delay += decision.prefilled_tokens / spec.prefill_tokens_per_second
        if state.fault is FaultMode.BATCH_MIX:
            # The engine steps its batch: requests that arrive meanwhile are decoded with it.
            delay = max(delay, BATCH_STEP_SECONDS)
        if delay > 0:
            await asyncio.sleep(delay)
        decision = state.batched(flight)
    finally:
        asyncio.get_running_loop().call_later(BATCH_STEP_SECONDS, state.leave, flight)

    return _served(state, chat, decision, include_usage)


def _served(
    state: EndpointState, chat: ChatRequest, decision: Answer | StreamFailure, include_usage: bool
) -> Response:
    """The response that renders what the engine decided: a stream or a completion."""
    model = state.spec.model
    if isinstance(decision, StreamFailure):
        return StreamingResponse(_failing_stream(model, decision), media_type="text/event-stream")
    if chat.stream and state.fault is FaultMode.ABORT_REUSE:
        # The engine decodes a token a step, so a client's disconnect lands mid-answer; the
        # request's pages are completed only if its answer is.
        stream = _answer_stream(
            model, decision, include_usage, DECODE_STEP_SECONDS, partial(state.complete_pages, chat)
        )
        return StreamingResponse(stream, media_type="text/event-stream")
    if chat.stream:
        pace = state.spec.decode_tokens_per_second
        stream = _answer_stream(model, decision, include_usage, 1 / pace if pace else 0.0)
        return StreamingResponse(stream, media_type="text/event-stream")
    return JSONResponse(_completion(model, decision))


async def tokenize(request: Request) -> Response:
    state = _endpoint(request)
    if not _authorised(state, request):
        return JSONResponse(errors.unauthorized(), 401)
    try:
        body = await _json_object(request)
        if "inputs" in body:  # TGI: a list of {id, text, start, stop}, special tokens included
            inputs = body["inputs"]
            if not isinstance(inputs, str):
                raise _BadRequest("inputs must be a string", "inputs")
            state.stats.tokenize_calls += 1
            offsets, start = [], 0
            for piece, token_id in zip(
                state.tokenizer.tokenize(inputs), state.tokenizer.token_ids(inputs), strict=True
            ):
                offsets.append(
                    {"id": token_id, "text": piece, "start": start, "stop": start + len(piece)}
                )
                start += len(piece)
            return JSONResponse(offsets)
        if "content" in body:  # llama.cpp
            content = body["content"]
            if not isinstance(content, str):
                raise _BadRequest("content must be a string", "content")
            state.stats.tokenize_calls += 1
            # The simulator's vocabulary has no BOS token, so add_special changes nothing.
            if body.get("with_pieces"):
                pieces = state.tokenizer.tokenize(content)
                ids = state.tokenizer.token_ids(content)
                return JSONResponse(
                    {"tokens": [{"id": i, "piece": p} for i, p in zip(ids, pieces, strict=True)]}
                )
            return JSONResponse({"tokens": state.tokenizer.token_ids(content)})
        if "messages" in body:  # vLLM TokenizeChatRequest
            text = render_chat(
                _messages(body["messages"]),
                add_generation_prompt=bool(body.get("add_generation_prompt", True)),
            )
        elif "prompt" in body:  # vLLM TokenizeCompletionRequest
            if not isinstance(body["prompt"], str):
                raise _BadRequest("prompt must be a string", "prompt")
            text = body["prompt"]
        else:
            raise _BadRequest("give messages, prompt or content")
    except _BadRequest as exc:
        return _error(state, 400, str(exc), exc.param)
    state.stats.tokenize_calls += 1
    ids = state.tokenizer.token_ids(text)
    return JSONResponse(
        {
            "count": len(ids),
            "max_model_len": state.spec.window,
            "tokens": ids,
            "token_strs": state.tokenizer.tokenize(text) if body.get("return_token_strs") else None,
        }
    )


async def apply_template(request: Request) -> Response:
    state = _endpoint(request)
    if not _authorised(state, request):
        return JSONResponse(errors.unauthorized(), 401)
    try:
        body = await _json_object(request)
        messages = _messages(body.get("messages"))
    except _BadRequest as exc:
        return _error(state, 400, str(exc), exc.param)
    return JSONResponse({"prompt": render_chat(messages)})


async def models(request: Request) -> Response:
    state = _endpoint(request)
    if not _authorised(state, request):
        return JSONResponse(errors.unauthorized(), 401)
    spec = state.spec
    card = {
        "id": spec.model,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "kvwatch-sim",
        "root": spec.model,
        "parent": None,
        "max_model_len": spec.window,
    }
    return JSONResponse({"object": "list", "data": [card]})


async def health(request: Request) -> Response:
    _endpoint(request)
    return JSONResponse({"status": "ok"})


async def set_fault(request: Request) -> Response:
    state = _endpoint(request)
    try:
        body = await _json_object(request)
        fault = FaultMode(str(body.get("fault")))
    except (_BadRequest, ValueError):
        valid = ", ".join(mode.value for mode in FaultMode)
        return _error(state, 400, f"fault must be one of: {valid}", "fault")
    state.fault = fault
    return JSONResponse({"name": state.spec.name, "fault": str(fault)})


async def set_fingerprint(request: Request) -> Response:
    """Redeploy the endpoint as far as its self-report goes: a new ``version``, a restart
    (``restart``, default true: a new process start time), and optionally a new ``fault`` in
    the same step, as a bad release brings its fault with it."""
    state = _endpoint(request)
    try:
        body = await _json_object(request)
        version = body.get("version")
        if version is not None and not isinstance(version, str):
            raise ValueError("version")
        restart = body.get("restart", True)
        if not isinstance(restart, bool):
            raise ValueError("restart")
        fault = FaultMode(str(body["fault"])) if "fault" in body else None
    except (_BadRequest, ValueError):
        return _error(
            state,
            400,
            "body: {version?: string, restart?: bool, fault?: one of "
            + ", ".join(mode.value for mode in FaultMode)
            + "}",
            "fingerprint",
        )
    state.redeploy(version, restart=restart, now=time.time())
    if fault is not None:
        state.fault = fault
    return JSONResponse(
        {
            "name": state.spec.name,
            "version": state.version,
            "started_at": state.started_at,
            "fault": str(state.fault),
        }
    )


async def stats(request: Request) -> Response:
    sim: Simulation = request.app.state.simulation
    return JSONResponse(sim.stats())


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    detail = exc.detail if isinstance(exc, HTTPException) else "Internal server error"
    return JSONResponse(
        errors.error_body(Flavour.VLLM, status, detail),
        status,
    )


def build_app(simulation: Simulation) -> Starlette:
    app = Starlette(
        routes=[
            *listing.routes(),
            *native.routes(),
            Route("/_sim/stats", stats, methods=["GET"]),
            Route("/_sim/traces", traces_route(simulation.traces), methods=["GET"]),
            Route("/{name}/_sim/fault", set_fault, methods=["PUT"]),
            Route("/{name}/_sim/fingerprint", set_fingerprint, methods=["PUT"]),
            Route("/{name}/v1/models", models, methods=["GET"]),
            Route("/{name}/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/{name}/tokenize", tokenize, methods=["POST"]),
            Route("/{name}/apply-template", apply_template, methods=["POST"]),
            Route("/{name}/health", health, methods=["GET"]),
        ],
        exception_handlers={HTTPException: _http_error},
        middleware=[
            Middleware(
                RecordTraces,
                traces=simulation.traces,
                endpoints=frozenset(ep.name for ep in simulation.endpoints),
            )
        ],
    )
    app.state.simulation = simulation
    app.state.listing = listing.Listing()
    return app
