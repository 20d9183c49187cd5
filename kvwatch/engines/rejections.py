"""Is this error body a context-length rejection? Pure: no I/O.

The *over* canary passes only on a 4xx that says "the prompt is too long for the window"; any
other 4xx (auth, unknown model, bad parameter) is a ``wrong_rejection``. Engines say it in
different ways, so structured fields are checked first and message text second. Each pattern
names the upstream file it was taken from; when an engine changes its wording, add the new
sentence here with a table test.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

from kvwatch.canary.model import Rejection

# 400: OpenAI, vLLM, SGLang, llama.cpp. 413: proxies and gateways in front of them (payload too
# large is how a window overflow surfaces there). 422: TGI's validation errors.
CONTEXT_STATUSES = frozenset({400, 413, 422})

# Structured markers, compared exactly against ``error.code`` / ``error.type``.
_CONTEXT_CODES = frozenset(
    {
        # OpenAI's error object: {"error": {"code": "context_length_exceeded", "type":
        # "invalid_request_error", "param": "messages", "message": "..."}} (OpenAI API
        # reference, "Error codes"; the Responses API uses the same code).
        "context_length_exceeded",
        # llama.cpp server: ERROR_TYPE_EXCEED_CONTEXT_SIZE -> "exceed_context_size_error",
        # HTTP 400, with n_prompt_tokens and n_ctx beside it
        # (tools/server/server-common.cpp, format_error_response; utils.hpp in older trees).
        "exceed_context_size_error",
    }
)

_MESSAGE_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        # OpenAI: "This model's maximum context length is 8192 tokens. However, your messages
        # resulted in 9000 tokens." vLLM, every version so far
        # (vllm/entrypoints/openai/serving_engine.py, later engine/serving.py and renderer):
        # "This model's maximum context length is N tokens. However, your request has M input
        # tokens." / "However, you requested M tokens (P in the messages, C in the
        # completion)." / "'max_tokens' or 'max_completion_tokens' is too large: C. This
        # model's maximum context length is N tokens and your request has P input tokens".
        r"maximum context length is \d",
        # vLLM get_max_tokens (vllm/entrypoints/utils.py):
        # "Input length (N) exceeds model's maximum context length (M)."
        r"exceeds model's maximum context length",
        # SGLang TokenizerManager._validate_one_request
        # (python/sglang/srt/managers/tokenizer_manager.py):
        # "The input (N tokens) is longer than the model's context length (M tokens)."
        r"is longer than the model's context length",
        # ... and "Requested token count exceeds the model's maximum context length of M
        # tokens. You requested a total of T tokens: ..."
        r"exceeds the model's maximum context length",
        # SGLang scheduler limit (python/sglang/srt/managers/utils.py validate_input_length,
        # raised as a 400 by the tokenizer manager's abort handling): "Input length (N
        # tokens) exceeds the maximum allowed length (M tokens). Use a shorter input or
        # enable --allow-auto-truncate." M is min(context_len, max_total_num_tokens) - 1, so
        # this is also how a KV pool smaller than the window is enforced.
        r"input length \(\d+ tokens\) exceeds the maximum allowed length",
        # Anthropic Messages API, 400 invalid_request_error: "prompt is too long: 208310
        # tokens > 200000 maximum" and "input length and `max_tokens` exceed context limit:
        # 188240 + 21333 > 200000, decrease input length or `max_tokens` and try again"
        # (docs.anthropic.com, "Errors" and "Context windows").
        r"prompt is too long: \d+ tokens > \d+",
        r"input length and `max_tokens` exceed context limit",
        # llama.cpp server (tools/server/server-context.cpp): "request (N tokens) exceeds the
        # available context size (M tokens), try increasing it" — matched by text too, for
        # proxies that keep the message but drop the type.
        r"exceeds the available context size",
        # TGI ValidationError::MaxTotalTokens (router/src/validation.rs), sent as 422
        # {"error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= N.
        # Given: P `inputs` tokens and C `max_new_tokens`", "error_type": "validation"}
        r"`inputs` tokens \+ `max_new_tokens` must be <=",
        # TGI ValidationError::InputLength (same file):
        # "Input validation error: `inputs` must have less than N tokens. Given: P"
        r"`inputs` must have less than \d+ tokens",
        # OpenAI Responses API: "Your input exceeds the context window of this model."
        r"input exceeds the context window",
    )
)

# The longest text we look at: error bodies are small; a huge one is not a rejection message.
_MAX_SCAN_CHARS = 64 * 1024


def classify_rejection(status: int, body: str | bytes | None) -> Rejection:
    """CONTEXT_LENGTH for a 400/413/422 whose body has a recognised shape; OTHER otherwise."""
    if status not in CONTEXT_STATUSES or body is None:
        return Rejection.OTHER
    return Rejection.CONTEXT_LENGTH if is_context_length_body(body) else Rejection.OTHER


def is_context_length_body(body: str | bytes) -> bool:
    """Whether an error body (JSON or plain text) says the prompt exceeds the context window.

    Status-agnostic: also used for error frames on a 2xx stream.
    """
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    text = text[:_MAX_SCAN_CHARS]
    try:
        payload: Any = json.loads(text)
    except ValueError:
        return _message_matches(text)
    return is_context_length_payload(payload, fallback_text=text)


def is_context_length_payload(payload: Any, *, fallback_text: str | None = None) -> bool:
    """The same test on an already-parsed JSON value (an SSE error frame, say)."""
    if _has_context_code(payload):
        return True
    messages = list(_messages(payload))
    if messages:
        return any(_message_matches(message) for message in messages)
    # JSON without any message field we know (a bare string, an odd wrapper): read it whole.
    return fallback_text is not None and _message_matches(fallback_text)


def error_message(payload: Any) -> str | None:
    """The first human message in an error payload, for error details."""
    return next(_messages(payload), None)


def _has_context_code(payload: Any) -> bool:
    if not isinstance(payload, dict):
        return False
    for holder in (payload.get("error"), payload):
        if isinstance(holder, dict):
            for key in ("code", "type"):
                value = holder.get(key)
                if isinstance(value, str) and value in _CONTEXT_CODES:
                    return True
    return False


def _messages(payload: Any) -> Iterator[str]:
    """Message strings where engines put them: ``error.message`` (OpenAI, vLLM, llama.cpp),
    ``error`` as a string (TGI), a top-level ``message`` (SGLang, older vLLM) and FastAPI's
    ``detail`` (a string, or a list of ``{"msg": ...}``)."""
    if isinstance(payload, str):
        yield payload
        return
    if not isinstance(payload, dict):
        return
    error = payload.get("error")
    if isinstance(error, str):
        yield error
    elif isinstance(error, dict):
        message = error.get("message")
        if isinstance(message, str):
            yield message
    message = payload.get("message")
    if isinstance(message, str):
        yield message
    detail = payload.get("detail")
    if isinstance(detail, str):
        yield detail
    elif isinstance(detail, list):
        for item in detail:
            if isinstance(item, dict) and isinstance(item.get("msg"), str):
                yield item["msg"]


def _message_matches(text: str) -> bool:
    # Typographic apostrophes (U+2019) and runs of whitespace (line-wrapped messages) are
    # normalised so a reworded proxy copy still reads like the upstream source.
    normal = " ".join(text.replace("\u2019", "'").split())
    return any(pattern.search(normal) for pattern in _MESSAGE_PATTERNS)
