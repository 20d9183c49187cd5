"""A prompt with one marker per depth is planned as exactly, with one verification."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvwatch.canary import markers
from kvwatch.canary.model import Placement, ProbeKind
from kvwatch.canary.planning import plan_prompt
from kvwatch.simulator import tokenizer
from kvwatch.simulator.model import render_chat
from tests.helpers.counters import SimCounter


async def _plan(depths, target, seed=1, kind=ProbeKind.UNDER):
    placed = [Placement(d, markers.new_marker()) for d in depths]
    first = min(placed, key=lambda p: p.depth)
    return await plan_prompt(
        kind,
        counter=SimCounter(),
        target_tokens=target,
        marker=first.marker,
        depth=first.depth,
        placements=placed,
        max_tokens=48,
        rng=random.Random(seed),
    )


@pytest.mark.parametrize("target", [1536, 8192 - 48, 131_072 - 48])
async def test_three_depths_land_exactly_on_target_with_one_full_prompt_count(target):
    """Several markers change only the fixed text: still exact, still one verification."""
    p = await _plan([0.0, 0.5, 1.0], target)
    assert p.planned_tokens == target == tokenizer.count(render_chat(p.messages))
    assert p.tokenize_calls == 1


async def test_each_marker_sits_at_its_depth_numbered_in_order_and_all_are_asked_for():
    """Code 1 opens the prompt, code 2 is mid-way, code 3 is right before the question."""
    p = await _plan([1.0, 0.0, 0.5], 20_000)
    text = p.messages[0].content
    assert [pl.depth for pl in p.placements] == [0.0, 0.5, 1.0]
    assert p.marker == p.placements[0].marker and p.marker_depth == 0.0
    at = [
        text.index(f"Code {i} is {pl.marker}.") / len(text)
        for i, pl in enumerate(p.placements, start=1)
    ]
    assert at[0] < 0.01 and 0.45 < at[1] < 0.55 and at[2] > 0.99
    assert text.endswith(
        "What are the 3 codes you were asked to remember? "
        "Answer with the codes only, in order, separated by spaces."
    )
    assert p.markers == tuple(pl.marker for pl in p.placements)


async def test_the_first_marker_must_be_the_shallowest_placement():
    """marker/depth name the probe's stored marker: it must be one of the placements."""
    with pytest.raises(ValueError, match="shallowest"):
        await plan_prompt(
            ProbeKind.UNDER,
            counter=SimCounter(),
            target_tokens=4000,
            marker="KVW-0000-0000-0000",
            placements=[Placement(0.0, markers.new_marker()), Placement(1.0, markers.new_marker())],
            max_tokens=48,
            rng=random.Random(1),
        )


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.floats(0.0, 1.0).map(lambda d: round(d, 2)), min_size=2, max_size=5, unique=True),
    st.integers(2_000, 40_000),
    st.integers(0, 2**32),
)
async def test_any_depths_plan_exactly_with_at_most_two_counts(depths, target, seed):
    """Whatever the depths, the prompt is exact, and a second count is the rare exception."""
    p = await _plan(depths, target, seed)
    assert tokenizer.count(render_chat(p.messages)) == p.planned_tokens == target
    assert p.tokenize_calls <= 2
    assert all(m in p.messages[0].content for m in p.markers)
