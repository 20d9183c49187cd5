"""The simulated model answers as many codes as it was asked for, from what it attended."""

from __future__ import annotations

from kvwatch.canary.markers import new_marker
from kvwatch.canary.model import Placement
from kvwatch.canary.planning import MultiLayout
from kvwatch.simulator.model import recall


def _prompt(n: int = 3) -> tuple[str, list[str]]:
    codes = [new_marker() for _ in range(n)]
    layout = MultiLayout(tuple(Placement(i / (n - 1), c) for i, c in enumerate(codes)))
    words = [f" word{i}" for i in range(300)]
    return layout.messages(words)[0].content, codes


def test_asked_for_three_codes_it_repeats_all_three_in_prompt_order():
    """The whole prompt attended: every code, space-separated, in order."""
    text, codes = _prompt()
    assert recall(text) == " ".join(codes)


def test_a_cut_head_keeps_the_question_and_the_codes_after_the_cut():
    """Without the opening instruction the closing question still says how many."""
    text, codes = _prompt()
    assert recall(text[len(text) // 3 :]) == " ".join(codes[1:])


def test_a_cut_tail_keeps_the_opening_instruction_and_the_codes_before_the_cut():
    """Without the question the opening instruction still says how many."""
    text, codes = _prompt()
    assert recall(text[: 2 * len(text) // 3]) == " ".join(codes[:2])
