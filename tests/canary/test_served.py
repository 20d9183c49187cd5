"""The served-window search (issue 12): where it probes, when it stops, what it concludes."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvwatch.canary import planning, served
from kvwatch.canary.served import (
    RESOLUTION,
    Observation,
    ServedSearch,
    next_size,
    observe,
    probe_budget,
    start,
)

WINDOW = 1_048_576
LOW = 1_536  # the baseline: the last size known to pass
UNDER = WINDOW - 32  # the under probe that failed

# An engine, for the search: (size) -> (served whole?, its own hint about the limit).
Engine = Callable[[int], tuple[bool, int | None]]


def truncating(limit: int) -> Engine:
    """Reads at most ``limit`` tokens and says so in usage (truncate_head/tail)."""
    return lambda size: (size <= limit, None if size <= limit else limit)


def rejecting(limit: int) -> Engine:
    """Refuses larger prompts with a message naming its limit (window_not_served)."""
    return lambda size: (size <= limit, None if size <= limit else limit)


def silent(limit: int) -> Engine:
    """Gives no signal at all (a placeholder swap reporting nothing useful)."""
    return lambda size: (size <= limit, None)


def lying(limit: int, claim: int) -> Engine:
    """Claims a limit that is not its limit."""
    return lambda size: (size <= limit, None if size <= limit else claim)


def run(
    engine: Engine,
    *,
    low: int = LOW,
    unserved: int = UNDER,
    window: int = WINDOW,
    pool: int | None = None,
) -> tuple[ServedSearch, list[int]]:
    whole, hint = engine(unserved)
    assert not whole, "the trigger must have failed"
    state = start(served=low, unserved=unserved, window=window, hints=(hint, pool))
    sizes = []
    while (size := next_size(state)) is not None:
        sizes.append(size)
        whole, hint = engine(size)
        state = observe(state, Observation(size=size, whole=whole, hint=hint))
    return state, sizes


@pytest.mark.parametrize(
    ("window", "budget"),
    [(1_048_576, 11), (131_072, 8), (4_096, 3), (2_048, 2), (1_024, 1), (1_000_000, 11)],
)
def test_the_budget_is_log2_of_the_window_over_1024_plus_one(window: int, budget: int) -> None:
    """⌈log2(window / 1024)⌉ + 1 probes, and at least one."""
    assert probe_budget(window) == budget


@pytest.mark.parametrize("limit", [4_096, 131_072, 681_280, LOW + 1, UNDER - 1])
def test_an_honest_truncation_signal_is_verified_by_two_probes(limit: int) -> None:
    """The reported prompt tokens are probed, then one token more: exact in two probes."""
    state, sizes = run(truncating(limit))
    assert sizes == [limit, limit + 1] if limit + 1 < UNDER else [limit]
    assert (state.served, state.exact) == (limit, True)


def test_the_kv_pool_is_a_candidate_when_the_engine_says_nothing() -> None:
    """A placeholder swap reports no limit; the KV pool from the capacity check is verified."""
    state, sizes = run(silent(681_280), pool=681_280)
    assert sizes == [681_280, 681_281]
    assert state.served == 681_280 and state.exact


@pytest.mark.parametrize("limit", [4_096, 131_072, 681_280, LOW + 1, UNDER - 1])
def test_without_signals_bisection_brackets_the_limit_within_the_budget(limit: int) -> None:
    """No hint at all: plain bisection to RESOLUTION tokens, never over the budget."""
    state, sizes = run(silent(limit))
    assert len(sizes) <= probe_budget(WINDOW)
    assert state.served <= limit < state.unserved
    assert state.unserved - state.served <= RESOLUTION


def test_a_signal_that_names_a_smaller_limit_does_not_end_the_search() -> None:
    """A hint below the limit passes, but one token more passes too: search on, above it."""
    state, sizes = run(lying(681_280, claim=1_000))
    assert sizes[:1] != [1_000]  # below the last passing size: not even tried
    state, sizes = run(lying(681_280, claim=300_000))
    assert sizes[:2] == [300_000, 300_001]
    assert state.served <= 681_280 < state.unserved
    assert state.served > 300_001


def test_a_signal_that_names_a_larger_limit_is_refuted_by_its_probe() -> None:
    """A hint above the limit fails its probe and becomes the new upper bound."""
    state, sizes = run(lying(131_072, claim=900_000))
    assert sizes[0] == 900_000
    assert state.served <= 131_072 < state.unserved <= 900_000


def test_a_placeholder_usage_of_one_token_is_ignored() -> None:
    """Reported 1 (the prompt swapped for a placeholder) is below anything known served."""
    state, sizes = run(lying(681_280, claim=1))
    assert 1 not in sizes
    assert state.served <= 681_280 < state.unserved


def test_a_passing_size_above_a_failing_one_moves_nothing() -> None:
    """Evidence against monotony (a flaky engine) never widens what is claimed served."""
    state = start(served=1_000, unserved=10_000, window=WINDOW)
    state = observe(state, Observation(size=5_000, whole=False))
    state = observe(state, Observation(size=7_000, whole=True))
    assert (state.served, state.unserved) == (1_000, 5_000)


def test_start_refuses_a_bracket_without_a_failure_above_a_pass() -> None:
    """The trigger must be larger than the last passing size."""
    with pytest.raises(ValueError, match="served"):
        start(served=5_000, unserved=5_000, window=WINDOW)


limits = st.integers(min_value=LOW, max_value=UNDER - 1)


@settings(max_examples=300, deadline=None)
@given(limit=limits, signal=st.sampled_from(["truncating", "silent"]))
def test_for_any_limit_the_search_ends_at_it_within_the_budget(limit: int, signal: str) -> None:
    """Any served limit in [low, window): found within the budget, exactly with a signal."""
    engine = truncating(limit) if signal == "truncating" else silent(limit)
    state, sizes = run(engine)
    assert len(sizes) <= probe_budget(WINDOW)
    assert state.served <= limit < state.unserved
    if signal == "truncating":
        assert state.served == limit and len(sizes) <= 2
    else:
        assert state.unserved - state.served <= RESOLUTION


@settings(max_examples=300, deadline=None)
@given(limit=limits, claim=st.integers(min_value=0, max_value=2 * WINDOW))
def test_a_lying_signal_never_makes_the_search_conclude_wrongly(limit: int, claim: int) -> None:
    """Whatever the engine claims, what is reported served was served, and what is reported
    unserved was not; the search stays within its budget."""
    state, sizes = run(lying(limit, claim))
    assert len(sizes) <= probe_budget(WINDOW)
    assert state.served <= limit < state.unserved
    if state.exact:
        assert state.served == limit


@settings(max_examples=200, deadline=None)
@given(
    window=st.integers(min_value=1, max_value=4 * 1_048_576),
    data=st.data(),
)
def test_bisection_fits_the_budget_for_any_window(window: int, data: st.DataObject) -> None:
    """From any bracket inside any window, silent bisection resolves within the budget."""
    unserved = data.draw(st.integers(min_value=1, max_value=window))
    low = data.draw(st.integers(min_value=0, max_value=unserved - 1))
    limit = data.draw(st.integers(min_value=low, max_value=unserved - 1))
    state, sizes = run(silent(limit), low=low, unserved=unserved, window=window)
    assert len(sizes) <= probe_budget(window)
    assert state.served <= limit < state.unserved


# Signals no served window can be: the first three are what hint_of hands over from a
# placeholder swap (1) or a stated limit smaller than max_tokens (0, negative); the others
# lie outside what the engine was already seen to do.
TINY = st.integers(min_value=-64, max_value=64)
OVER_THE_WINDOW = st.integers(min_value=WINDOW + 1, max_value=4 * WINDOW)
UNDER_THE_BASELINE = st.integers(min_value=1, max_value=LOW - 1)


@pytest.mark.parametrize("claim", [1, 0])
def test_a_placeholder_count_with_no_passing_baseline_is_never_probed(claim: int) -> None:
    """Nothing passed yet (low 0): the 1 a swapped prompt reports, or 0, is not probed (no
    canary is that small); the KV pool is verified instead, to the token."""
    state, sizes = run(lying(681_280, claim), low=0, pool=681_280)
    assert sizes == [681_280, 681_281]
    assert (state.served, state.exact) == (681_280, True)


@pytest.mark.parametrize("claim", [1, 0, 2 * WINDOW])
def test_without_any_other_signal_a_bad_one_leaves_the_search_to_bisection(claim: int) -> None:
    """No baseline, no pool, only the engine's useless count: bisection brackets the limit."""
    state, sizes = run(lying(681_280, claim), low=0)
    assert claim not in sizes
    assert min(sizes) >= planning.smallest_canary()
    assert state.served <= 681_280 < state.unserved
    assert state.unserved - state.served <= RESOLUTION


@settings(max_examples=400, deadline=None)
@given(
    limit=limits,
    kind=st.sampled_from(["tiny", "over the window", "under the baseline"]),
    baseline=st.booleans(),
    pool_known=st.booleans(),
    data=st.data(),
)
def test_a_signal_that_cannot_be_the_served_window_never_becomes_it_nor_stops_the_search(
    limit: int, kind: str, baseline: bool, pool_known: bool, data: st.DataObject
) -> None:
    """1, 0, more than the window, less than the last passing baseline: never probed, never
    the answer; the search goes on by the other signal (to the token) or by bisection."""
    low = LOW if baseline or kind == "under the baseline" else 0
    claim = data.draw(
        {
            "tiny": TINY,
            "over the window": OVER_THE_WINDOW,
            "under the baseline": UNDER_THE_BASELINE,
        }[kind]
    )
    state, sizes = run(lying(limit, claim), low=low, pool=limit if pool_known else None)
    assert claim not in sizes
    # Every step can be planned: nothing below the smallest canary, nothing at or below low.
    assert all(size > low and size >= min(planning.smallest_canary(), low + 1) for size in sizes)
    assert len(sizes) <= probe_budget(WINDOW)
    assert state.served in (low, *sizes)  # the answer is a size a probe proved
    assert state.served <= limit < state.unserved
    if pool_known:
        assert (state.served, state.exact) == (limit, True)
    else:
        assert state.resolved


def test_bisection_never_goes_below_the_smallest_canary() -> None:
    """A bracket reaching below the floor is halved over the part a canary can be planned in."""
    state = start(served=0, unserved=4_000, window=8_192, floor=3_000)
    sizes = []
    while (size := next_size(state)) is not None:
        sizes.append(size)
        state = observe(state, Observation(size=size, whole=False))
    assert sizes == [3_499, 3_249, 3_124, 3_061]  # the budget of an 8,192 window: 4
    assert (state.served, state.unserved) == (0, 3_061)


def test_a_passing_baseline_below_the_general_floor_lowers_it() -> None:
    """A canary was planned at the baseline's size: a candidate just above it is probed."""
    small = planning.smallest_canary() // 2
    state = start(served=small, unserved=2_016, window=2_048, hints=(small + 100,))
    assert state.floor == small + 1
    assert next_size(state) == small + 100


def test_a_size_the_planner_refused_raises_the_floor_and_keeps_the_bracket() -> None:
    """A refused step is kvwatch's limit, not the engine's: the search goes on above it."""
    state = start(served=0, unserved=16_352, window=16_384, hints=(6_144,))
    assert next_size(state) == 6_144
    state = served.unplannable(state, 6_144)
    assert (state.served, state.unserved, state.floor) == (0, 16_352, 6_145)
    assert next_size(state) == (6_144 + 16_352) // 2
    state = observe(state, Observation(size=11_248, whole=True))
    assert state.served == 11_248


def test_a_planner_that_refuses_every_size_ends_the_search_within_the_budget() -> None:
    """Refusals count against the budget, so the search ends with the bracket it started."""
    state = start(served=1_536, unserved=1_048_544, window=WINDOW)
    refused = 0
    while (size := next_size(state)) is not None:
        state = served.unplannable(state, size)
        refused += 1
    assert refused == probe_budget(WINDOW)
    assert (state.served, state.unserved) == (1_536, 1_048_544)
