"""Boundary sizes follow each engine's own acceptance rule (DESIGN §1)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvwatch.canary.model import ProbeKind
from kvwatch.canary.sizing import (
    AcceptanceRule,
    SizingError,
    served_window,
    target_prompt_tokens,
)

VLLM = AcceptanceRule.PROMPT_PLUS_MAX_TOKENS
LLAMA = AcceptanceRule.PROMPT_BELOW_WINDOW
OLLAMA = AcceptanceRule.PROMPT_UP_TO_WINDOW


@pytest.mark.parametrize(
    ("kind", "rule", "expected"),
    [
        (ProbeKind.UNDER, VLLM, 4096 - 32),
        (ProbeKind.OVER, VLLM, 4096 - 32 + 1),
        (ProbeKind.UNDER, LLAMA, 4096 - 32),
        (ProbeKind.OVER, LLAMA, 4096),
        (ProbeKind.UNDER, OLLAMA, 4096 - 32),
        (ProbeKind.OVER, OLLAMA, 4096 + 1),
        (ProbeKind.BASELINE, VLLM, 1536),
    ],
)
def test_each_kind_gets_its_size_by_the_engine_rule(kind, rule, expected):
    """under leaves room for the answer; over is the smallest prompt the rule rejects."""
    assert (
        target_prompt_tokens(kind, rule=rule, window=4096, max_tokens=32, baseline_tokens=1536)
        == expected
    )


def test_a_margin_moves_both_edges_away_from_the_boundary():
    """Estimated counts plan under lower and over higher by the margin."""
    args = {"rule": VLLM, "window": 4096, "max_tokens": 32, "baseline_tokens": 100, "margin": 50}
    assert target_prompt_tokens(ProbeKind.UNDER, **args) == 4096 - 32 - 50
    assert target_prompt_tokens(ProbeKind.OVER, **args) == 4096 - 32 + 1 + 50


def test_it_refuses_a_max_tokens_that_fills_the_window():
    """No under prompt fits when max_tokens ≥ window."""
    with pytest.raises(SizingError):
        target_prompt_tokens(
            ProbeKind.UNDER, rule=VLLM, window=32, max_tokens=32, baseline_tokens=10
        )


@given(st.integers(64, 2_000_000), st.integers(1, 63), st.sampled_from([VLLM, LLAMA, OLLAMA]))
def test_under_is_always_accepted_and_over_always_rejected_by_the_rule(window, max_tokens, rule):
    """Property: under satisfies the engine's rule; over violates it by the least amount."""

    def accepted(prompt: int) -> bool:
        if rule is VLLM:
            return prompt + max_tokens <= window
        if rule is OLLAMA:
            # Not refused either way: "accepted" here means read whole, not cut.
            return prompt <= window
        return prompt < window

    kw = {"rule": rule, "window": window, "max_tokens": max_tokens, "baseline_tokens": 10}
    under = target_prompt_tokens(ProbeKind.UNDER, **kw)
    over = target_prompt_tokens(ProbeKind.OVER, **kw)
    assert accepted(under)
    assert under + max_tokens == window
    assert not accepted(over)
    assert accepted(over - 1)


def test_a_prompt_cap_below_the_window_moves_the_boundary_to_the_cap():
    """TGI max_input_tokens 1,024 of 2,048 total: under carries 1,024 tokens, over 1,025."""
    rule = AcceptanceRule.PROMPT_PLUS_MAX_TOKENS
    window = served_window(2048, rule=rule, max_prompt_tokens=1024, max_tokens=32)
    assert window == 1056
    assert (
        target_prompt_tokens(
            ProbeKind.UNDER, rule=rule, window=window, max_tokens=32, baseline_tokens=200
        )
        == 1024
    )
    assert (
        target_prompt_tokens(
            ProbeKind.OVER, rule=rule, window=window, max_tokens=32, baseline_tokens=200
        )
        == 1025
    )


def test_a_prompt_cap_that_does_not_bind_leaves_the_window_alone():
    """TGI's modern default (max_input_tokens = total - 1) and no cap change nothing."""
    rule = AcceptanceRule.PROMPT_PLUS_MAX_TOKENS
    assert served_window(2048, rule=rule, max_prompt_tokens=2047, max_tokens=32) == 2048
    assert served_window(2048, rule=rule, max_prompt_tokens=None, max_tokens=32) == 2048
    below = AcceptanceRule.PROMPT_BELOW_WINDOW
    assert served_window(4096, rule=below, max_prompt_tokens=1000, max_tokens=32) == 1001
    # Ollama reads a prompt of up to the window whole: a cap is the window itself.
    assert served_window(4096, rule=OLLAMA, max_prompt_tokens=1000, max_tokens=32) == 1000
