"""Error bodies in the exact shapes real engines send, so adapters are tested against them.

Sources (checked against upstream code):

- vLLM: ``ErrorResponse{error: ErrorInfo{message, type, param, code}}`` with ``code`` the HTTP
  status (vllm/entrypoints/openai/protocol.py, ``ErrorInfo`` / ``ErrorResponse``); the
  context-length message is the v0.18+ wording (vllm/renderers/params.py raising
  ``VLLMValidationError(..., parameter="input_tokens", value=P)``, whose ``__str__`` appends
  ``(parameter=..., value=...)``; vllm/exceptions.py). Older releases said "However, you
  requested X tokens (P in the messages, M in the completion)"
  (vllm/entrypoints/openai/serving_engine.py ``_validate_input``); the OpenAI flavour keeps
  that classic text.
- vLLM mid-stream errors: ``data: {"error": {...}}`` built by ``create_streaming_error_response``
  (vllm/entrypoints/openai/serving_engine.py), which defaults to ``BadRequestError`` / 400
  even for engine failures, followed by ``data: [DONE]``.
- llama.cpp server: ``format_error_response`` plus, for ``ERROR_TYPE_EXCEED_CONTEXT_SIZE``,
  ``n_prompt_tokens`` and ``n_ctx`` (tools/server/server-task.cpp,
  ``server_task_result_error::to_json``); message "request (%d tokens) exceeds the available
  context size (%d tokens), try increasing it" (tools/server/server-context.cpp).
- OpenAI: ``{"error": {"message", "type": "invalid_request_error", "param": "messages",
  "code": "context_length_exceeded"}}``; 401 ``invalid_api_key``; 429 ``rate_limit_exceeded``.
"""

from __future__ import annotations

from typing import Any

from kvwatch.simulator.spec import Flavour

ErrorBody = dict[str, Any]

_VLLM_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    500: "InternalServerError",
}
_LLAMACPP_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    500: "server_error",
}
_OPENAI_TYPES = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    500: "server_error",
}


_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    429: "rate_limit_error",
    500: "api_error",
}


def context_status(flavour: Flavour) -> int:
    """The status of a context-length rejection: TGI's validation errors are 422."""
    return 422 if flavour is Flavour.TGI else 400


def _type(types: dict[int, str], status: int) -> str:
    return types.get(status, types[400] if status < 500 else types[500])


def error_body(
    flavour: Flavour, status: int, message: str, *, param: str | None = None
) -> ErrorBody:
    """A generic error of ``status`` in the flavour's envelope."""
    if flavour is Flavour.SGLANG:
        # python/sglang/srt/entrypoints/openai/protocol.py ErrorResponse.
        kind = _type(_VLLM_TYPES, status)
        return {"object": "error", "message": message, "type": kind, "param": param, "code": status}
    if flavour is Flavour.TGI:
        # router/src/lib.rs ErrorResponse{error, error_type}.
        return {"error": message, "error_type": "validation" if status < 500 else "generation"}
    if flavour is Flavour.OLLAMA:
        return {"error": message}
    if flavour is Flavour.ANTHROPIC:
        return {
            "type": "error",
            "error": {"type": _type(_ANTHROPIC_TYPES, status), "message": message},
        }
    if flavour is Flavour.LLAMACPP:
        return {
            "error": {"code": status, "message": message, "type": _type(_LLAMACPP_TYPES, status)}
        }
    if flavour is Flavour.OPENAI:
        return {
            "error": {
                "message": message,
                "type": _type(_OPENAI_TYPES, status),
                "param": param,
                "code": None,
            }
        }
    return {
        "error": {
            "message": message,
            "type": _type(_VLLM_TYPES, status),
            "param": param,
            "code": status,
        }
    }


def context_length_error(
    flavour: Flavour, *, window: int, prompt_tokens: int, max_tokens: int | None
) -> ErrorBody:
    """The body each engine sends when a request does not fit its context window."""
    if flavour is Flavour.SGLANG:
        return error_body(flavour, 400, _sglang_context(window, prompt_tokens, max_tokens))
    if flavour is Flavour.TGI:
        return error_body(
            flavour,
            422,
            f"Input validation error: `inputs` tokens + `max_new_tokens` must be <= {window}. "
            f"Given: {prompt_tokens} `inputs` tokens and {max_tokens or 0} `max_new_tokens`",
        )
    if flavour is Flavour.ANTHROPIC:
        return error_body(
            flavour,
            400,
            f"prompt is too long: {prompt_tokens + (max_tokens or 0)} tokens > {window} maximum",
        )
    if flavour is Flavour.LLAMACPP:
        return _llamacpp_context(window, prompt_tokens)
    if flavour is Flavour.OPENAI:
        return _openai_context(window, prompt_tokens, max_tokens)
    return _vllm_context(window, prompt_tokens, max_tokens)


def _sglang_context(window: int, prompt_tokens: int, max_tokens: int | None) -> str:
    # SGLang words a prompt that alone is too long apart from one whose answer does not fit.
    if max_tokens is None or prompt_tokens >= window:
        return (
            f"The input ({prompt_tokens} tokens) is longer than the model's context "
            f"length ({window} tokens)."
        )
    return (
        "Requested token count exceeds the model's maximum context length of "
        f"{window} tokens. You requested a total of {prompt_tokens + max_tokens} "
        f"tokens: {prompt_tokens} tokens from the input messages and {max_tokens} "
        "tokens for the completion. Please reduce the number of tokens in the input "
        "messages or the completion to fit within the limit."
    )


def _llamacpp_context(window: int, prompt_tokens: int) -> ErrorBody:
    return {
        "error": {
            "code": 400,
            "message": (
                f"request ({prompt_tokens} tokens) exceeds the available context size "
                f"({window} tokens), try increasing it"
            ),
            "type": "exceed_context_size_error",
            "n_prompt_tokens": prompt_tokens,
            "n_ctx": window,
        }
    }


def _openai_context(window: int, prompt_tokens: int, max_tokens: int | None) -> ErrorBody:
    if max_tokens is None:
        detail = f"However, your messages resulted in {prompt_tokens} tokens. "
        advice = "Please reduce the length of the messages."
    else:
        detail = (
            f"However, you requested {prompt_tokens + max_tokens} tokens "
            f"({prompt_tokens} in the messages, {max_tokens} in the completion). "
        )
        advice = "Please reduce the length of the messages or completion."
    message = f"This model's maximum context length is {window} tokens. {detail}{advice}"
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def _vllm_context(window: int, prompt_tokens: int, max_tokens: int | None) -> ErrorBody:
    output = max_tokens or 0
    return {
        "error": {
            "message": (
                f"This model's maximum context length is {window} tokens. However, you "
                f"requested {output} output tokens and your prompt contains {prompt_tokens} "
                f"input tokens, for a total of {prompt_tokens + output} tokens. Please reduce "
                "the length of the input prompt or the number of requested output tokens. "
                f"(parameter=input_tokens, value={prompt_tokens})"
            ),
            "type": "BadRequestError",
            "param": "input_tokens",
            "code": 400,
        }
    }


def stream_error_frame(flavour: Flavour, message: str) -> ErrorBody:
    """The payload of a ``data:`` frame that reports a failure inside a 200 stream."""
    if flavour is Flavour.VLLM:
        # vLLM's create_streaming_error_response defaults to BadRequestError/400.
        return error_body(flavour, 400, message)
    return error_body(flavour, 500, message)


def unauthorized() -> ErrorBody:
    return {
        "error": {
            "message": "Incorrect API key provided.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }


def rate_limited(retry_after: int) -> ErrorBody:
    return {
        "error": {
            "message": f"Rate limit reached for requests. Please try again in {retry_after}s.",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }


def pool_limit_error(*, limit: int, prompt_tokens: int) -> ErrorBody:
    """SGLang's scheduler abort for a prompt of at least ``max_req_input_len`` tokens
    (python/sglang/srt/managers/utils.py validate_input_length), sent as a 400."""
    return error_body(
        Flavour.SGLANG,
        400,
        f"Input length ({prompt_tokens} tokens) exceeds the maximum allowed length ({limit} "
        "tokens). Use a shorter input or enable --allow-auto-truncate.",
    )


def input_length_error(*, limit: int, prompt_tokens: int) -> ErrorBody:
    """TGI's validation error for a prompt above ``max_input_tokens`` (router/src/validation.rs
    ValidationError::InputLength), checked before the total, sent as a 422."""
    return error_body(
        Flavour.TGI,
        422,
        f"Input validation error: `inputs` must have less than {limit} tokens. "
        f"Given: {prompt_tokens}",
    )
