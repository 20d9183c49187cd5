"""Context-length rejection recognition: real-shaped bodies from each engine, and look-alikes."""

from __future__ import annotations

import json

import pytest

from kvwatch.canary.model import Rejection
from kvwatch.engines.rejections import classify_rejection, is_context_length_payload

CONTEXT = Rejection.CONTEXT_LENGTH
OTHER = Rejection.OTHER


def _j(value: object) -> str:
    return json.dumps(value)


CONTEXT_BODIES = [
    pytest.param(
        400,
        _j(
            {
                "error": {
                    "message": "This model's maximum context length is 8192 tokens. However, "
                    "your messages resulted in 9000 tokens. Please reduce the length of the "
                    "messages.",
                    "type": "invalid_request_error",
                    "param": "messages",
                    "code": "context_length_exceeded",
                }
            }
        ),
        id="openai-chat",
    ),
    pytest.param(
        400,
        _j(
            {
                "error": {
                    "message": "Your input exceeds the context window of this model.",
                    "type": "invalid_request_error",
                    "param": "input",
                    "code": "context_length_exceeded",
                }
            }
        ),
        id="openai-responses",
    ),
    pytest.param(
        400,
        _j({"error": {"message": "too long", "code": "context_length_exceeded"}}),
        id="openai-code-only",
    ),
    pytest.param(
        400,
        _j(
            {
                "error": {
                    "message": "This model's maximum context length is 4096 tokens. However, "
                    "your request has 4200 input tokens. Please reduce the length of the input "
                    "messages. (parameter=input_tokens, value=4200)",
                    "type": "BadRequestError",
                    "param": "input_tokens",
                    "code": 400,
                }
            }
        ),
        id="vllm-current",
    ),
    pytest.param(
        400,
        _j(
            {
                "error": {
                    "message": "'max_tokens' or 'max_completion_tokens' is too large: 8000. "
                    "This model's maximum context length is 4096 tokens and your request has "
                    "2778 input tokens (8000 > 4096 - 2778). None",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            }
        ),
        id="vllm-max-tokens-too-large",
    ),
    pytest.param(
        400,
        _j(
            {
                "object": "error",
                "message": "This model's maximum context length is 4096 tokens. However, you "
                "requested 4112 tokens (4096 in the messages, 16 in the completion). Please "
                "reduce the length of the messages or completion.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        ),
        id="vllm-legacy-top-level",
    ),
    pytest.param(
        400,
        _j(
            {
                "error": {
                    "message": "Input length (5000) exceeds model's maximum context length (4096).",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            }
        ),
        id="vllm-get-max-tokens",
    ),
    pytest.param(
        400,
        _j(
            {
                "object": "error",
                "message": "The input (5000 tokens) is longer than the model's context length "
                "(4096 tokens).",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        ),
        id="sglang-input",
    ),
    pytest.param(
        400,
        _j(
            {
                "object": "error",
                "message": "Requested token count exceeds the model's maximum context length "
                "of 4096 tokens. You requested a total of 4112 tokens: 4096 tokens from the "
                "input messages and 16 tokens for the completion. Please reduce the number of "
                "tokens in the input messages or the completion to fit within the limit.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        ),
        id="sglang-total",
    ),
    pytest.param(
        400,
        _j(
            {
                "error": {
                    "code": 400,
                    "message": "request (4096 tokens) exceeds the available context size "
                    "(4096 tokens), try increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 4096,
                    "n_ctx": 4096,
                }
            }
        ),
        id="llamacpp",
    ),
    pytest.param(
        400,
        _j({"error": {"code": 400, "type": "exceed_context_size_error"}}),
        id="llamacpp-type-only",
    ),
    pytest.param(
        422,
        _j(
            {
                "error": "Input validation error: `inputs` tokens + `max_new_tokens` must be "
                "<= 4096. Given: 4090 `inputs` tokens and 16 `max_new_tokens`",
                "error_type": "validation",
            }
        ),
        id="tgi-total",
    ),
    pytest.param(
        422,
        _j(
            {
                "error": "Input validation error: `inputs` must have less than 4000 tokens. "
                "Given: 4100",
                "error_type": "validation",
            }
        ),
        id="tgi-input-length",
    ),
    pytest.param(
        413,
        "This model’s maximum context length is 4096 tokens.\nHowever, your messages "
        "resulted in 5000 tokens.",
        id="plain-text-proxy-413",
    ),
    pytest.param(
        400,
        _j({"detail": "The input (5000 tokens) is longer than the model's context length."}),
        id="fastapi-detail",
    ),
    pytest.param(
        400,
        b'{"error":{"code":400,"type":"exceed_context_size_error","message":"x"}}',
        id="bytes-body",
    ),
]


@pytest.mark.parametrize(("status", "body"), CONTEXT_BODIES)
def test_it_recognises_each_engines_context_length_rejection(
    status: int, body: str | bytes
) -> None:
    """Every known engine shape on a 400/413/422 reads as a context-length rejection."""
    assert classify_rejection(status, body) is CONTEXT


OTHER_BODIES = [
    pytest.param(
        401,
        _j(
            {
                "error": {
                    "message": "Incorrect API key provided.",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_api_key",
                }
            }
        ),
        id="auth",
    ),
    pytest.param(
        404,
        _j(
            {
                "error": {
                    "message": "The model `gpt-x` does not exist.",
                    "type": "NotFoundError",
                    "param": "model",
                    "code": 404,
                }
            }
        ),
        id="model-not-found",
    ),
    pytest.param(400, "{not json", id="invalid-json"),
    pytest.param(400, "", id="empty"),
    pytest.param(
        400,
        _j(
            {
                "error": {
                    "message": "temperature must be non-negative, got -1.",
                    "type": "BadRequestError",
                    "param": "temperature",
                    "code": 400,
                }
            }
        ),
        id="unrelated-400",
    ),
    pytest.param(
        422,
        _j(
            {
                "error": "Input validation error: `max_new_tokens` must be <= 2048. Given: 4096",
                "error_type": "validation",
            }
        ),
        id="tgi-max-new-tokens-alone",
    ),
    pytest.param(
        500,
        _j(
            {
                "error": {
                    "message": "This model's maximum context length is 4096 tokens.",
                    "type": "InternalServerError",
                    "code": 500,
                }
            }
        ),
        id="context-words-on-500",
    ),
    pytest.param(
        429,
        _j({"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}}),
        id="throttled",
    ),
    pytest.param(
        400,
        _j({"error": {"message": "context window", "code": "invalid_value"}}),
        id="vague-context-words",
    ),
    pytest.param(400, None, id="no-body"),
    pytest.param(400, _j(["maximum context length is"]), id="json-list"),
]


@pytest.mark.parametrize(("status", "body"), OTHER_BODIES)
def test_it_does_not_mistake_other_errors_for_context_length(
    status: int, body: str | bytes | None
) -> None:
    """Auth, unknown model, bad JSON, other validation errors and non-4xx statuses are OTHER."""
    assert classify_rejection(status, body) is OTHER


def test_it_recognises_a_stream_error_frame_payload() -> None:
    """An error frame's payload is judged by shape alone (its stream was a 200)."""
    frame = {"error": {"message": "x", "type": "exceed_context_size_error", "code": 400}}
    assert is_context_length_payload(frame)
    assert not is_context_length_payload({"error": {"message": "engine crashed", "code": 500}})
