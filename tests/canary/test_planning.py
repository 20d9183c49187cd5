"""Planning hits exact token counts with few full-prompt counts, and varies per probe."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvwatch.canary import markers
from kvwatch.canary.model import Placement, ProbeKind
from kvwatch.canary.planning import PlanningError, plan_prompt, smallest_canary
from kvwatch.simulator import tokenizer
from kvwatch.simulator.model import render_chat
from tests.helpers.counters import SimCounter


async def _plan(kind, target, counter=None, seed=1, depth=0.0):
    counter = counter or SimCounter()
    return await plan_prompt(
        kind,
        counter=counter,
        target_tokens=target,
        marker=markers.new_marker(),
        max_tokens=32,
        rng=random.Random(seed),
        depth=depth,
    )


@pytest.mark.parametrize("target", [4096 - 32, 131_072 - 32])
async def test_an_exact_counter_gets_an_exact_prompt(target):
    """Planned equals target and equals the tokenizer's own count of the rendered prompt."""
    p = await _plan(ProbeKind.UNDER, target)
    assert p.planned_tokens == target
    assert tokenizer.count(render_chat(p.messages)) == target
    assert p.tokenize_calls == 1  # counted pieces add up: one verification suffices


async def test_the_marker_sits_at_the_start_by_default_and_the_question_at_the_end():
    """Layout: instruction with marker first, question last."""
    p = await _plan(ProbeKind.BASELINE, 1536)
    text = p.messages[0].content
    assert text.index(p.marker) < 40
    assert text.rstrip().endswith("Answer with the code only.")


async def test_a_marker_depth_plants_the_marker_inside_the_filler():
    """Depth 0.5 puts the marker near the middle of the text."""
    p = await _plan(ProbeKind.UNDER, 8000, depth=0.5)
    text = p.messages[0].content
    assert 0.4 < text.index(p.marker) / len(text) < 0.6
    assert p.marker_depth == 0.5


async def test_two_probes_get_different_filler():
    """Filler differs per probe, so no prefix cache can make a canary cheap and blind."""
    a = await _plan(ProbeKind.UNDER, 3000, seed=1)
    b = await _plan(ProbeKind.UNDER, 3000, seed=2)
    fa = a.messages[0].content.split("\n\n")[1]
    fb = b.messages[0].content.split("\n\n")[1]
    assert fa[:200] != fb[:200]


async def test_a_target_below_the_fixed_text_is_refused():
    """A window too small for the canary itself is a planning error, not a silent pass."""
    with pytest.raises(PlanningError, match="fixed text"):
        await _plan(ProbeKind.UNDER, 10)


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(min_value=1, max_value=8),
    depth=st.sampled_from([0.0, 0.3, 1.0]),
    seed=st.integers(min_value=0, max_value=2**32),
)
async def test_a_canary_of_the_smallest_size_can_always_be_planned(count, depth, seed):
    """smallest_canary(n) fits a canary with n markers at any depth (a bisect step of that
    size is never refused); far below it the planner refuses, which is why it exists."""
    ordered = sorted({depth, *(i / count for i in range(count))})[:count]
    placements = [Placement(d, markers.new_marker()) for d in ordered] if count > 1 else []
    first = placements[0] if placements else Placement(depth, markers.new_marker())
    size = smallest_canary(count)
    plan = await plan_prompt(
        ProbeKind.BISECT,
        counter=SimCounter(),
        target_tokens=size,
        marker=first.marker,
        max_tokens=32,
        rng=random.Random(seed),
        depth=first.depth,
        placements=placements,
    )
    # Planned, at or just under the size (a several-marker layout cannot always be steered
    # to the token within the planner's rounds; it never goes over).
    assert size - 8 <= plan.planned_tokens <= size
    with pytest.raises(PlanningError, match="fixed text"):
        await plan_prompt(
            ProbeKind.BISECT,
            counter=SimCounter(),
            target_tokens=size // 8,
            marker=first.marker,
            max_tokens=32,
            rng=random.Random(seed),
            depth=first.depth,
            placements=placements,
        )


async def test_an_estimating_counter_verifies_once_and_keeps_its_tolerance():
    """An inexact counter is not asked again and again; its plan carries a tolerance."""
    counter = SimCounter(exact=False)
    p = await _plan(ProbeKind.UNDER, 20_000, counter=counter)
    assert p.tokenize_calls == 1
    assert not p.exact and p.tolerance == 200


@settings(max_examples=40, deadline=None)
@given(
    st.integers(300, 20_000),
    st.sampled_from(ProbeKind),
    st.integers(0, 2**32),
    st.sampled_from([0.0, 0.25, 0.9]),
)
async def test_planning_is_exact_for_any_target_kind_seed_and_depth(target, kind, seed, depth):
    """Property: with an exact counter every plan lands on its target, marker included."""
    p = await _plan(kind, target, seed=seed, depth=depth)
    assert p.planned_tokens == target
    assert tokenizer.count(render_chat(p.messages)) == target
    assert markers.contains_marker(p.messages[0].content, p.marker)


class CollapsingCounter(SimCounter):
    """A serving stack whose chat template renders every conversation as one word."""

    async def count_prompt(self, messages):
        self.prompt_calls += 1
        return 3


async def test_a_template_that_drops_the_text_is_planned_by_content_and_noted():
    """The engine's count does not grow with the filler: plan by content, say why."""
    p = await _plan(ProbeKind.UNDER, 2016, counter=CollapsingCounter())
    assert p.tokenize_calls == 1
    assert p.planned_tokens > 1900
    assert p.note is not None and "chat template drops the prompt's text" in p.note
