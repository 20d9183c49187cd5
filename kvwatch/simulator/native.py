"""Engine-specific routes: each simulated flavour answers its engine's discovery endpoints and
native APIs in that engine's wire shapes (sources as cited in :mod:`kvwatch.engines`), and a
route another engine would not have answers 404.

- vllm: ``GET /metrics`` with ``vllm:cache_config_info{block_size="16",num_gpu_blocks=...}``
  computed from the KV pool (rounded down to whole blocks);
- sglang: ``GET /get_server_info`` and ``/server_info`` (``context_length``,
  ``max_total_num_tokens`` = the KV pool, ``max_req_input_len``);
- llamacpp: ``GET /props`` (``default_generation_settings.n_ctx``, ``total_slots``) and
  ``/slots``;
- tgi: ``GET /info``, ``POST /chat_tokenize``, ``/generate`` and ``/generate_stream``;
- ollama: ``POST /api/chat`` (JSON or NDJSON), ``/api/show``, ``GET /api/ps``;
- anthropic: ``POST /v1/messages`` (JSON or its event stream), ``/v1/messages/count_tokens``,
  ``GET /v1/models/{model}``;
- every OpenAI-compatible flavour: ``POST /v1/completions``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from kvwatch.canary.model import Message
from kvwatch.simulator import errors
from kvwatch.simulator.model import (
    Answer,
    ChatRequest,
    EndpointState,
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
from kvwatch.simulator.spec import Flavour

BLOCK_SIZE = 16
OPENAI_COMPATIBLE = (Flavour.VLLM, Flavour.OPENAI, Flavour.SGLANG, Flavour.LLAMACPP, Flavour.TGI)
Handler = Callable[[Request], Awaitable[Response]]


class _Absent(Exception):
    """The route exists on another engine, not on this flavour."""


def _state(request: Request, *flavours: Flavour) -> EndpointState:
    state = _endpoint(request)
    if state.spec.flavour not in flavours:
        raise _Absent
    return state


def _guarded(handler: Handler) -> Handler:
    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except _Absent:
            return PlainTextResponse("Not Found", 404)
        except _BadRequest as exc:
            return _error(_endpoint(request), 400, str(exc), exc.param)

    return run


def _unauthorised(state: EndpointState) -> Response:
    state.stats.requests += 1
    state.stats.rejected += 1
    if state.spec.flavour is Flavour.ANTHROPIC:
        body = errors.error_body(Flavour.ANTHROPIC, 401, "invalid x-api-key")
        return JSONResponse(body, 401)
    return JSONResponse(errors.unauthorized(), 401)


async def _serve(
    state: EndpointState, chat: ChatRequest, request: Request
) -> Answer | StreamFailure | Response:
    """Decide, and wait out the simulated prefill; a rejection is returned as its response."""
    decision = state.handle(dataclasses.replace(chat, tenant=credential(state, request)))
    if not isinstance(decision, Answer | StreamFailure):
        return JSONResponse(decision.body, decision.status, headers=decision.headers)
    delay = state.spec.ttfb_delay
    if state.spec.prefill_tokens_per_second > 0:
        delay += decision.prefilled_tokens / state.spec.prefill_tokens_per_second
    if delay > 0:
        await asyncio.sleep(delay)
    return decision


# -- discovery ---------------------------------------------------------------------------------


async def vllm_metrics(request: Request) -> Response:
    state = _state(request, Flavour.VLLM)
    blocks = state.spec.pool_tokens // BLOCK_SIZE
    text = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        f'vllm:cache_config_info{{block_size="{BLOCK_SIZE}",cache_dtype="auto",'
        f'enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",'
        f'num_cpu_blocks="None",num_gpu_blocks="{blocks}"}} 1.0\n'
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",model_name="{state.spec.model}"}} 0.0\n'
        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n"
        "# TYPE process_start_time_seconds gauge\n"
        f"process_start_time_seconds {state.started_at}\n"
    )
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4; charset=utf-8")


async def sglang_server_info(request: Request) -> Response:
    state = _state(request, Flavour.SGLANG)
    spec = state.spec
    return JSONResponse(
        {
            "model_path": spec.model,
            "served_model_name": spec.model,
            "context_length": spec.window,
            "allow_auto_truncate": False,
            "max_total_num_tokens": spec.pool_tokens,
            "max_req_input_len": min(spec.window, spec.pool_tokens) - 1,
            "internal_states": [{"last_gen_throughput": 0.0}],
            "version": state.version,
        }
    )


async def llamacpp_props(request: Request) -> Response:
    state = _state(request, Flavour.LLAMACPP)
    spec = state.spec
    return JSONResponse(
        {
            "default_generation_settings": {"id": 0, "n_ctx": spec.window, "params": {}},
            "total_slots": 1,
            "model_path": f"/models/{spec.model}.gguf",
            "chat_template": "chatml",
            "build_info": f"b{state.deploys}-{state.version}",
        }
    )


async def llamacpp_slots(request: Request) -> Response:
    state = _state(request, Flavour.LLAMACPP)
    return JSONResponse([{"id": 0, "n_ctx": state.spec.window, "is_processing": False}])


async def tgi_info(request: Request) -> Response:
    state = _state(request, Flavour.TGI)
    spec = state.spec
    return JSONResponse(
        {
            "model_id": spec.model,
            "max_input_tokens": spec.input_limit,
            "max_total_tokens": spec.window,
            "max_concurrent_requests": 128,
            "router": "text-generation-router",
            "version": state.version,
            "sha": f"sim{state.deploys:04d}",
        }
    )


async def tgi_chat_tokenize(request: Request) -> Response:
    state = _state(request, Flavour.TGI)
    if not _authorised(state, request):
        return _unauthorised(state)
    body = await _json_object(request)
    text = render_chat(_messages(body.get("messages")))
    state.stats.tokenize_calls += 1
    tokens, start = [], 0
    for piece, token_id in zip(
        state.tokenizer.tokenize(text), state.tokenizer.token_ids(text), strict=True
    ):
        tokens.append({"id": token_id, "text": piece, "start": start, "stop": start + len(piece)})
        start += len(piece)
    return JSONResponse({"tokenize_response": tokens, "templated_text": text})


# -- TGI native generate -------------------------------------------------------------------------


def _tgi_request(body: dict[str, Any], *, stream: bool) -> ChatRequest:
    inputs = body.get("inputs")
    if not isinstance(inputs, str) or not inputs:
        raise _BadRequest("inputs must be a non-empty string", "inputs")
    params = body.get("parameters") or {}
    if not isinstance(params, dict):
        raise _BadRequest("parameters must be an object", "parameters")
    max_new = params.get("max_new_tokens")
    if max_new is not None and (not isinstance(max_new, int) or max_new < 1):
        raise _BadRequest("max_new_tokens must be a positive integer", "max_new_tokens")
    return ChatRequest(
        messages=(Message("user", inputs),), max_tokens=max_new, stream=stream, raw_prompt=inputs
    )


_TGI_FINISH = {"stop": "eos_token", "length": "length"}


async def tgi_generate(request: Request) -> Response:
    state = _state(request, Flavour.TGI)
    if not _authorised(state, request):
        return _unauthorised(state)
    outcome = await _serve(state, _tgi_request(await _json_object(request), stream=False), request)
    if isinstance(outcome, Response):
        return outcome
    if isinstance(outcome, StreamFailure):
        return JSONResponse(outcome.error, 500)
    details = {
        "finish_reason": _TGI_FINISH[outcome.finish_reason],
        "generated_tokens": outcome.completion_tokens,
        "seed": None,
        "prefill": [],
        "tokens": [],
    }
    return JSONResponse(
        {"generated_text": outcome.text, "details": details},
        headers={
            "x-prompt-tokens": str(outcome.prompt_tokens),
            "x-generated-tokens": str(outcome.completion_tokens),
        },
    )


async def tgi_generate_stream(request: Request) -> Response:
    state = _state(request, Flavour.TGI)
    if not _authorised(state, request):
        return _unauthorised(state)
    outcome = await _serve(state, _tgi_request(await _json_object(request), stream=True), request)
    if isinstance(outcome, Response):
        return outcome

    async def events() -> AsyncIterator[bytes]:
        if isinstance(outcome, StreamFailure):
            yield _sse(outcome.error)
            return
        pieces = outcome.pieces
        for index, piece in enumerate(pieces):
            last = index == len(pieces) - 1
            yield _sse(
                {
                    "index": index,
                    "token": {"id": index, "text": piece, "logprob": 0.0, "special": False},
                    "generated_text": outcome.text if last else None,
                    "details": {
                        "finish_reason": _TGI_FINISH[outcome.finish_reason],
                        "generated_tokens": outcome.completion_tokens,
                        "input_length": outcome.prompt_tokens,
                        "seed": None,
                    }
                    if last
                    else None,
                }
            )

    return StreamingResponse(events(), media_type="text/event-stream")


# -- OpenAI completions --------------------------------------------------------------------------


def _completion_object(model: str, answer: Answer) -> dict[str, Any]:
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": answer.text,
                "logprobs": None,
                "finish_reason": answer.finish_reason,
            }
        ],
        "usage": _usage(answer),
    }


async def completions(request: Request) -> Response:
    state = _state(request, *OPENAI_COMPATIBLE)
    if not _authorised(state, request):
        return _unauthorised(state)
    body = await _json_object(request)
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise _BadRequest("prompt must be a non-empty string", "prompt")
    stream = bool(body.get("stream", False))
    chat = ChatRequest(
        messages=(Message("user", prompt),),
        max_tokens=_max_tokens(body),
        stream=stream,
        raw_prompt=prompt,
    )
    outcome = await _serve(state, chat, request)
    if isinstance(outcome, Response):
        return outcome
    model = state.spec.model
    if isinstance(outcome, StreamFailure):
        if not stream:
            return JSONResponse(outcome.error, 500)

        async def failing() -> AsyncIterator[bytes]:
            yield _sse(outcome.error)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(failing(), media_type="text/event-stream")
    if not stream:
        return JSONResponse(_completion_object(model, outcome))
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))

    async def chunks() -> AsyncIterator[bytes]:
        whole = _completion_object(model, outcome)
        for piece in outcome.pieces:
            yield _sse(
                {
                    **whole,
                    "choices": [{"index": 0, "text": piece, "finish_reason": None}],
                    "usage": None,
                }
            )
        yield _sse(
            {
                **whole,
                "choices": [{"index": 0, "text": "", "finish_reason": outcome.finish_reason}],
                "usage": None,
            }
        )
        if include_usage:
            yield _sse({**whole, "choices": [], "usage": _usage(outcome)})
        yield b"data: [DONE]\n\n"

    return StreamingResponse(chunks(), media_type="text/event-stream")


# -- Ollama --------------------------------------------------------------------------------------


async def ollama_chat(request: Request) -> Response:
    state = _state(request, Flavour.OLLAMA)
    body = await _json_object(request)
    model = body.get("model")
    if model != state.spec.model:
        return JSONResponse({"error": f"model '{model}' not found"}, 404)
    options = body.get("options") or {}
    num_predict = options.get("num_predict") if isinstance(options, dict) else None
    stream = body.get("stream", True) is not False  # Ollama streams unless told not to
    chat = ChatRequest(
        messages=_messages(body.get("messages")),
        max_tokens=num_predict if isinstance(num_predict, int) and num_predict > 0 else None,
        stream=stream,
    )
    outcome = await _serve(state, chat, request)
    if isinstance(outcome, Response):
        return outcome
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if isinstance(outcome, StreamFailure):
        if not stream:
            return JSONResponse(outcome.error, 500)

        async def failing() -> AsyncIterator[bytes]:
            yield (json.dumps(outcome.error) + "\n").encode()

        return StreamingResponse(failing(), media_type="application/x-ndjson")
    final = {
        "model": state.spec.model,
        "created_at": created,
        "done": True,
        "done_reason": outcome.finish_reason,
        "prompt_eval_count": outcome.prompt_tokens,
        "eval_count": outcome.completion_tokens,
    }
    if not stream:
        return JSONResponse({**final, "message": {"role": "assistant", "content": outcome.text}})

    async def lines() -> AsyncIterator[bytes]:
        for piece in outcome.pieces:
            line = {
                "model": state.spec.model,
                "created_at": created,
                "message": {"role": "assistant", "content": piece},
                "done": False,
            }
            yield (json.dumps(line) + "\n").encode()
        yield (
            json.dumps({**final, "message": {"role": "assistant", "content": ""}}) + "\n"
        ).encode()

    return StreamingResponse(lines(), media_type="application/x-ndjson")


async def ollama_show(request: Request) -> Response:
    state = _state(request, Flavour.OLLAMA)
    body = await _json_object(request)
    if body.get("model") != state.spec.model:
        return JSONResponse({"error": f"model '{body.get('model')}' not found"}, 404)
    return JSONResponse(
        {
            "parameters": f'num_ctx                        {state.spec.window}\nstop "<|im_end|>"',
            "details": {"family": "sim", "format": "gguf"},
            "model_info": {"general.architecture": "sim", "sim.context_length": 131072},
        }
    )


async def ollama_ps(request: Request) -> Response:
    state = _state(request, Flavour.OLLAMA)
    spec = state.spec
    return JSONResponse(
        {
            "models": [
                {
                    "name": spec.model,
                    "model": spec.model,
                    "context_length": spec.window,
                    "digest": f"{state.deploys:064x}",
                }
            ]
        }
    )


async def vllm_version(request: Request) -> Response:
    state = _state(request, Flavour.VLLM)
    return JSONResponse({"version": state.version})


async def ollama_version(request: Request) -> Response:
    state = _state(request, Flavour.OLLAMA)
    return JSONResponse({"version": state.version})


# -- Anthropic -----------------------------------------------------------------------------------


def _anthropic_request(body: dict[str, Any], *, stream: bool) -> ChatRequest:
    system = body.get("system")
    messages = _messages(body.get("messages"))
    if isinstance(system, str) and system:
        messages = (Message("system", system), *messages)
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise _BadRequest("max_tokens: Field required", "max_tokens")
    return ChatRequest(messages=messages, max_tokens=max_tokens, stream=stream)


_ANTHROPIC_STOP = {"stop": "end_turn", "length": "max_tokens"}


async def anthropic_messages(request: Request) -> Response:
    state = _state(request, Flavour.ANTHROPIC)
    if not _authorised(state, request):
        return _unauthorised(state)
    body = await _json_object(request)
    stream = bool(body.get("stream", False))
    outcome = await _serve(state, _anthropic_request(body, stream=stream), request)
    if isinstance(outcome, Response):
        return outcome
    message_id = f"msg_{uuid.uuid4().hex[:24]}"
    if isinstance(outcome, StreamFailure):
        return _anthropic_overloaded(message_id, stream=stream)
    if not stream:
        return JSONResponse(_anthropic_message(message_id, state.spec.model, outcome))
    events = _anthropic_events(message_id, state.spec.model, outcome)
    return StreamingResponse(events, media_type="text/event-stream")


def _anthropic_overloaded(message_id: str, *, stream: bool) -> Response:
    """Anthropic's answer when the engine fails mid-request: a 529, or an error event after
    the stream has started."""
    failure = errors.error_body(Flavour.ANTHROPIC, 500, "Overloaded")
    failure["error"]["type"] = "overloaded_error"
    if not stream:
        return JSONResponse(failure, 529)

    async def failing() -> AsyncIterator[bytes]:
        yield _event(
            "message_start",
            {
                "type": "message_start",
                "message": {"id": message_id, "usage": {"input_tokens": 0, "output_tokens": 0}},
            },
        )
        yield _event("error", failure)

    return StreamingResponse(failing(), media_type="text/event-stream")


def _anthropic_message(message_id: str, model: str, outcome: Answer) -> dict[str, Any]:
    """A whole (non-streamed) Messages API answer."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": outcome.text}],
        "stop_reason": _ANTHROPIC_STOP[outcome.finish_reason],
        "stop_sequence": None,
        "usage": {
            "input_tokens": outcome.prompt_tokens,
            "output_tokens": outcome.completion_tokens,
        },
    }


async def _anthropic_events(message_id: str, model: str, outcome: Answer) -> AsyncIterator[bytes]:
    """A streamed Messages API answer, event by event as Anthropic sends them."""
    start: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": outcome.prompt_tokens, "output_tokens": 1},
    }
    yield _event("message_start", {"type": "message_start", "message": start})
    yield _event(
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        },
    )
    yield _event("ping", {"type": "ping"})
    for piece in outcome.pieces:
        yield _event(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": piece},
            },
        )
    yield _event("content_block_stop", {"type": "content_block_stop", "index": 0})
    yield _event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": _ANTHROPIC_STOP[outcome.finish_reason], "stop_sequence": None},
            "usage": {"output_tokens": outcome.completion_tokens},
        },
    )
    yield _event("message_stop", {"type": "message_stop"})


def _event(name: str, payload: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode()


async def anthropic_count_tokens(request: Request) -> Response:
    state = _state(request, Flavour.ANTHROPIC)
    if not _authorised(state, request):
        return _unauthorised(state)
    body = await _json_object(request)
    system = body.get("system")
    messages = _messages(body.get("messages"))
    if isinstance(system, str) and system:
        messages = (Message("system", system), *messages)
    state.stats.tokenize_calls += 1
    return JSONResponse({"input_tokens": state.tokenizer.count(render_chat(messages))})


async def anthropic_model(request: Request) -> Response:
    state = _state(request, Flavour.ANTHROPIC)
    if not _authorised(state, request):
        return _unauthorised(state)
    if request.path_params["model"] != state.spec.model:
        return JSONResponse(errors.error_body(Flavour.ANTHROPIC, 404, "model not found"), 404)
    return JSONResponse({"type": "model", "id": state.spec.model, "display_name": state.spec.model})


def routes() -> list[Route]:
    table: list[tuple[str, Handler, str]] = [
        ("/{name}/metrics", vllm_metrics, "GET"),
        ("/{name}/version", vllm_version, "GET"),
        ("/{name}/api/version", ollama_version, "GET"),
        ("/{name}/get_server_info", sglang_server_info, "GET"),
        ("/{name}/server_info", sglang_server_info, "GET"),
        ("/{name}/props", llamacpp_props, "GET"),
        ("/{name}/slots", llamacpp_slots, "GET"),
        ("/{name}/info", tgi_info, "GET"),
        ("/{name}/chat_tokenize", tgi_chat_tokenize, "POST"),
        ("/{name}/generate", tgi_generate, "POST"),
        ("/{name}/generate_stream", tgi_generate_stream, "POST"),
        ("/{name}/v1/completions", completions, "POST"),
        ("/{name}/api/chat", ollama_chat, "POST"),
        ("/{name}/api/show", ollama_show, "POST"),
        ("/{name}/api/ps", ollama_ps, "GET"),
        ("/{name}/v1/messages", anthropic_messages, "POST"),
        ("/{name}/v1/messages/count_tokens", anthropic_count_tokens, "POST"),
        ("/{name}/v1/models/{model}", anthropic_model, "GET"),
    ]
    return [Route(path, _guarded(handler), methods=[method]) for path, handler, method in table]
