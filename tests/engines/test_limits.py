"""The limit a context-length rejection states, read from each engine's real-shaped body."""

from __future__ import annotations

import json

import pytest

from kvwatch.canary.sizing import AcceptanceRule
from kvwatch.engines.limits import Bound, StatedLimit, stated_limit, stated_prompt_tokens

PPMT, BELOW = AcceptanceRule.PROMPT_PLUS_MAX_TOKENS, AcceptanceRule.PROMPT_BELOW_WINDOW


def _j(value: object) -> str:
    return json.dumps(value)


# (body, rule, max_tokens, the largest prompt the engine admits)
CASES = [
    pytest.param(
        _j(
            {
                "error": {
                    "message": "This model's maximum context length is 681280 tokens. However,"
                    " your request has 1048544 input tokens.",
                    "type": "BadRequestError",
                    "code": 400,
                }
            }
        ),
        PPMT,
        32,
        681_248,
        id="vllm",
    ),
    pytest.param(
        _j(
            {
                "error": {
                    "code": 400,
                    "message": "request (5000 tokens) exceeds the available context size "
                    "(4096 tokens), try increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 5000,
                    "n_ctx": 4096,
                }
            }
        ),
        BELOW,
        32,
        4_095,
        id="llamacpp-n_ctx",
    ),
    pytest.param(
        "request (5000 tokens) exceeds the available context size (4,096 tokens), try it",
        BELOW,
        32,
        4_095,
        id="llamacpp-text-through-a-proxy",
    ),
    pytest.param(
        _j(
            {
                "error": "Input validation error: `inputs` tokens + `max_new_tokens` must be "
                "<= 8192. Given: 8200 `inputs` tokens and 32 `max_new_tokens`",
                "error_type": "validation",
            }
        ),
        PPMT,
        32,
        8_160,
        id="tgi-total",
    ),
    pytest.param(
        _j(
            {
                "error": "Input validation error: `inputs` must have less than 4095 tokens. "
                "Given: 5000",
                "error_type": "validation",
            }
        ),
        PPMT,
        32,
        4_095,  # TGI refuses input_length > max_input_length: "less than" admits 4095
        id="tgi-input",
    ),
    pytest.param(
        _j(
            {
                "object": "error",
                "message": "Input length (7000 tokens) exceeds the maximum allowed length "
                "(6143 tokens). Use a shorter input or enable --allow-auto-truncate.",
                "code": 400,
            }
        ),
        PPMT,
        32,
        6_142,
        id="sglang-scheduler",
    ),
    pytest.param(
        _j(
            {
                "object": "error",
                "message": "The input (9000 tokens) is longer than the "
                "model's context length (8192 tokens).",
                "code": 400,
            }
        ),
        PPMT,
        32,
        8_160,
        id="sglang-context",
    ),
    pytest.param(
        _j(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 208310 tokens > 200000 maximum",
                },
            }
        ),
        PPMT,
        1024,
        198_976,
        id="anthropic",
    ),
]


@pytest.mark.parametrize(("body", "rule", "max_tokens", "largest"), CASES)
def test_a_stated_limit_becomes_the_largest_prompt_the_engine_admits(
    body: str, rule: AcceptanceRule, max_tokens: int, largest: int
) -> None:
    """Each engine's wording, read as the largest prompt its own rule lets through."""
    limit = stated_limit(body)
    assert limit is not None
    assert limit.largest_prompt(rule=rule, max_tokens=max_tokens) == largest


@pytest.mark.parametrize(
    "body",
    [
        None,
        "",
        _j({"error": {"message": "Invalid API key", "type": "invalid_request_error"}}),
        _j({"error": {"message": "Your input exceeds the context window of this model."}}),
        _j({"error": {"type": "exceed_context_size_error", "n_ctx": "4096"}}),
        "maximum context length is 0 tokens",
    ],
)
def test_a_body_without_a_readable_number_states_no_limit(body: str | None) -> None:
    """No number (or a nonsensical one): no hint, and the search bisects instead."""
    assert stated_limit(body) is None


def test_a_window_bound_follows_the_engines_rule() -> None:
    """ "The context length" is the whole request on vLLM, the prompt alone on llama.cpp."""
    limit = StatedLimit(4_096, Bound.WINDOW)
    assert limit.largest_prompt(rule=PPMT, max_tokens=32) == 4_064
    assert limit.largest_prompt(rule=BELOW, max_tokens=32) == 4_095


@pytest.mark.parametrize(
    ("body", "count"),
    [
        # vLLM v0.18+ and earlier; OpenAI; llama.cpp; SGLang; TGI; Anthropic.
        (
            '{"error": {"message": "This model\'s maximum context length is 8192 tokens. '
            "However, you requested 32 output tokens and your prompt contains 8200 input "
            'tokens, for a total of 8232 tokens."}}',
            8200,
        ),
        (
            '{"error": {"message": "\'max_tokens\' is too large: 32. This model\'s maximum '
            "context length is 4096 tokens and your request has 2778 input tokens "
            '(32 > 4096 - 2778)."}}',
            2778,
        ),
        (
            '{"error": {"message": "This model\'s maximum context length is 8192 tokens. '
            'However, you requested 8232 tokens (8200 in the messages, 32 in the completion)."}}',
            8200,
        ),
        (
            '{"error": {"code": 400, "message": "request (4476 tokens) exceeds the available '
            'context size (4096 tokens)", "type": "exceed_context_size_error", '
            '"n_prompt_tokens": 4476, "n_ctx": 4096}}',
            4476,
        ),
        ('{"message": "The input (9000 tokens) is longer than the model\'s context length"}', 9000),
        (
            '{"error": "Input validation error: `inputs` tokens + `max_new_tokens` must be '
            '<= 8192. Given: 8200 `inputs` tokens and 32 `max_new_tokens`"}',
            8200,
        ),
        ('{"error": {"message": "prompt is too long: 208310 tokens > 200000 maximum"}}', 208310),
    ],
)
def test_a_rejection_states_the_prompt_tokens_the_engine_counted(body: str, count: int) -> None:
    """Each engine's wording of its own count is read as that count."""
    assert stated_prompt_tokens(body) == count


@pytest.mark.parametrize(
    "body",
    [
        None,
        "",
        '{"error": {"message": "your prompt contains at least 97 input tokens"}}',
        '{"error": {"message": "maximum context length is 8192 tokens"}}',
    ],
)
def test_a_rejection_without_a_count_states_none(body: str | None) -> None:
    """A bound the engine stopped counting at, or no count at all, is not a count."""
    assert stated_prompt_tokens(body) is None
