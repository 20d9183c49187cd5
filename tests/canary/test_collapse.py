"""Collapse detection: a template that drops the canary's text is told from one keeping it."""

from __future__ import annotations

import pytest

from kvwatch.canary.collapse import (
    KEPT_FRACTION,
    MIN_TEXT_TOKENS,
    swallowed_reason,
    template_swallows_content,
)


def test_a_template_that_collapses_every_prompt_to_three_tokens_swallows_the_content() -> None:
    """llama.cpp with --chat-template gemma: 3 tokens empty, 3 tokens with 2,000 of filler."""
    assert template_swallows_content(3, 3, 2000)


def test_a_template_that_keeps_the_text_exactly_does_not_swallow_it() -> None:
    """Gemma's real template: the count grows by exactly the filler's own tokens."""
    assert not template_swallows_content(40, 2016, 1976)


@pytest.mark.parametrize("wobble", [-3, -1, 0, 2, 5])
def test_merges_at_the_joins_do_not_look_like_a_swallowed_text(wobble: int) -> None:
    """A few tokens of BPE drift at the template's seams are no collapse."""
    assert not template_swallows_content(40, 40 + 500 + wobble, 500)


def test_a_template_that_keeps_under_half_the_text_swallows_it() -> None:
    """A template cutting the content to a fixed length is a truncation too."""
    text = 2000
    kept = int(text * KEPT_FRACTION) - 1
    assert template_swallows_content(40, 40 + kept, text)


def test_too_little_filler_is_never_judged() -> None:
    """Below MIN_TEXT_TOKENS of filler the joins' drift could dominate: no verdict either way."""
    assert not template_swallows_content(3, 3, MIN_TEXT_TOKENS - 1)
    assert template_swallows_content(3, 3, MIN_TEXT_TOKENS)


def test_the_reason_names_the_counts_before_and_after_the_filler() -> None:
    """The probe's reason shows the evidence: filler added, templated count unchanged."""
    reason = swallowed_reason(3, 3, 2013)
    assert reason == (
        "the chat template drops the prompt's text: adding 2013 tokens of filler changed "
        "the templated prompt from 3 to 3 tokens"
    )
