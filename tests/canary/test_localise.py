"""Per-depth outcomes name the part of the prompt the engine lost, in one plain sentence."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvwatch.canary.localise import Lost, classify, localise, outcomes
from kvwatch.canary.model import DepthOutcome, DepthResult, ForeignMarker, Placement

F, M, X = DepthOutcome.FOUND, DepthOutcome.MISSING, DepthOutcome.FOREIGN
A, B, C = "KVW-AAAA-AAAA-AAAA", "KVW-BBBB-BBBB-BBBB", "KVW-CCCC-CCCC-CCCC"


def _results(*pairs: tuple[float, DepthOutcome]) -> list[DepthResult]:
    return [DepthResult(d, f"KVW-{i:04d}-0000-0000", o) for i, (d, o) in enumerate(pairs)]


@pytest.mark.parametrize(
    ("pairs", "lost"),
    [
        ([(0.0, F), (0.5, F), (1.0, F)], Lost.NONE),
        ([(0.0, M), (0.5, F), (1.0, F)], Lost.HEAD),
        ([(0.0, M), (0.25, M), (0.75, F), (1.0, F)], Lost.HEAD),
        ([(0.0, F), (0.5, F), (1.0, M)], Lost.TAIL),
        ([(0.0, F), (0.5, M), (1.0, M)], Lost.TAIL),
        ([(0.0, F), (0.5, M), (1.0, F)], Lost.MIDDLE),
        ([(0.0, F), (0.25, X), (0.75, M), (1.0, F)], Lost.MIDDLE),
        ([(0.0, M), (0.5, M), (1.0, M)], Lost.ALL),
        ([(0.0, X), (1.0, X)], Lost.ALL),
        ([(0.0, M), (0.5, F), (1.0, M)], Lost.SCATTERED),
        ([(0.0, F), (0.25, M), (0.5, F), (0.75, M), (1.0, F)], Lost.SCATTERED),
    ],
)
def test_the_lost_markers_name_head_tail_middle_all_or_scattered(pairs, lost):
    """Contiguous lost markers at the start are the head, at the end the tail, else middle."""
    assert classify(_results(*pairs)) is lost


def test_a_lost_head_reported_by_usage_says_how_many_last_tokens_were_kept():
    """The issue's sentence: lost and found depths listed, kept tokens from usage."""
    found = localise(
        _results((0.0, M), (0.25, M), (0.75, F), (1.0, F)), planned=131_040, reported=65_536
    )
    assert found.sentence == (
        "head lost (markers at 0.0, 0.25 missing; 0.75, 1.0 found): "
        "the engine kept the last ~65,536 tokens"
    )
    assert found.span == pytest.approx((0.0, 1.0 - 65_536 / 131_040))


def test_a_lost_tail_with_usage_as_planned_is_bounded_by_the_marker_depths():
    """An engine that reports every token but lost the tail: the kept part lies between the
    last found and the first missing marker."""
    found = localise(_results((0.0, F), (0.5, F), (1.0, M)), planned=8_000, reported=8_000)
    assert found.sentence == (
        "tail lost (markers at 1.0 missing; 0.0, 0.5 found): "
        "the engine kept the first ~4,000–8,000 tokens"
    )
    assert found.span == (0.75, 1.0)


def test_a_lost_middle_says_between_which_tokens():
    """Markers at both ends recalled, inner ones not: a stretch in the middle was dropped."""
    found = localise(_results((0.0, F), (0.5, M), (1.0, F)), planned=10_000, reported=6_000)
    assert found.sentence == (
        "middle lost (markers at 0.5 missing; 0.0, 1.0 found): the engine dropped ~4,000 "
        "tokens between ~0 and ~10,000"
    )


def test_all_lost_names_the_foreign_depths_and_what_the_engine_read():
    """Every marker lost, some to another probe's marker: the listing says which."""
    found = localise(_results((0.0, X), (1.0, X)), planned=8_000, reported=1)
    assert found.sentence == (
        "all lost (markers at 0.0, 1.0 foreign): the engine read 1 of 8,000 tokens"
    )
    assert found.span == (0.0, 1.0)


def test_outcomes_match_markers_in_any_spelling_and_mark_lost_ones_foreign_on_a_leak():
    """Recall tolerates presentation noise; a leak makes every unrecalled marker foreign."""
    placements = [Placement(1.0, C), Placement(0.0, A), Placement(0.5, B)]
    answer = "codes: kvw aaaa aaaa aaaa, **KVW-CCCC-CCCC-CCCC**"
    assert [(r.depth, r.outcome) for r in outcomes(placements, answer, [])] == [
        (0.0, F),
        (0.5, M),
        (1.0, F),
    ]
    leak = ForeignMarker("KVW-DDDD-DDDD-DDDD", 7, "other", datetime(2026, 3, 1, tzinfo=UTC))
    assert [r.outcome for r in outcomes(placements, answer, [leak])] == [F, X, F]


depth_lists = st.lists(
    st.sampled_from([0.0, 0.1, 0.25, 0.4, 0.5, 0.6, 0.75, 0.9, 1.0]),
    min_size=2,
    max_size=6,
    unique=True,
).map(sorted)


@given(depth_lists, st.integers(min_value=1, max_value=5), st.integers(1_000, 2_000_000))
def test_a_prefix_cut_is_always_head_lost_and_a_suffix_cut_tail_lost(depths, k, planned):
    """Losing the first k markers (and not all) is head lost; the last k is tail lost; the
    estimated lost span always lies inside the prompt."""
    k = min(k, len(depths) - 1)
    head = [DepthResult(d, "m", M if i < k else F) for i, d in enumerate(depths)]
    tail = [DepthResult(d, "m", F if i < len(depths) - k else M) for i, d in enumerate(depths)]
    for results, lost in ((head, Lost.HEAD), (tail, Lost.TAIL)):
        found = localise(results, planned=planned, reported=planned)
        assert found.lost is lost
        assert found.sentence.startswith(f"{lost.value} lost (markers at ")
        assert found.span is not None and 0.0 <= found.span[0] <= found.span[1] <= 1.0


@given(depth_lists, st.data())
def test_every_outcome_pattern_is_classified_and_the_order_of_results_does_not_matter(depths, data):
    """Classification is total and depends on depths, not on the order results come in."""
    size = len(depths)
    pattern = data.draw(st.lists(st.sampled_from([F, M, X]), min_size=size, max_size=size))
    results = [DepthResult(d, "m", o) for d, o in zip(depths, pattern, strict=True)]
    shuffled = data.draw(st.permutations(results))
    assert localise(shuffled, planned=10_000, reported=None) == localise(
        results, planned=10_000, reported=None
    )
    assert (classify(results) is Lost.NONE) == all(o is F for o in pattern)
