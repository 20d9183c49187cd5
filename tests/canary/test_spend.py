"""A token budget paces the expensive kinds and refuses written intervals that cannot fit."""

from __future__ import annotations

import pytest

from kvwatch.canary.model import ProbeKind
from kvwatch.canary.spend import DAY, OverBudget, RunShape, fit_budget, per_day, run_tokens
from kvwatch.config import parse_config

UNDER, OVER, BASELINE, CAPACITY = (
    ProbeKind.UNDER,
    ProbeKind.OVER,
    ProbeKind.BASELINE,
    ProbeKind.CAPACITY,
)
MILLION = RunShape(
    flavour="vllm",
    window=1_048_576,
    max_tokens=32,
    baseline_tokens=1536,
    burst_sizes=(4,),
    burst_prompt_tokens=256,
)


def test_an_under_run_spends_the_whole_window_and_an_over_run_refused_at_admission_nothing() -> (
    None
):
    """under: prompt + answer = window; over on vLLM: tokenized and refused, 0 spent."""
    assert run_tokens(UNDER, MILLION).spent == 1_048_576
    assert run_tokens(OVER, MILLION).spent == 0
    assert run_tokens(BASELINE, MILLION).spent == 1536 + 32
    assert run_tokens(CAPACITY, MILLION).spent == 0


def test_an_over_run_on_ollama_prefills_the_window_it_keeps() -> None:
    """Ollama cuts an over-long prompt to its window, and prefills that."""
    ollama = RunShape("ollama", 8192, 32, 1536, (4,), 256)
    assert run_tokens(OVER, ollama).prefilled == 8192


def test_kinds_already_inside_the_budget_keep_their_intervals() -> None:
    """A budget larger than the plan changes nothing."""
    per_run = {UNDER: 1_048_576.0, CAPACITY: 0.0}
    intervals = {UNDER: 3600.0, CAPACITY: 60.0}
    plan = fit_budget(per_run, intervals, frozenset(), 30_000_000)
    assert plan.intervals == intervals
    assert plan.planned_per_day == 24 * 1_048_576


def test_the_expensive_kinds_are_slowed_to_the_shortest_whole_minute_that_fits() -> None:
    """under + baseline at 15 min on a 1M window with a 4M budget: one common interval in
    whole minutes, and the plan then fits; the free capacity check keeps its minute."""
    per_run = {UNDER: 1_048_576.0, BASELINE: 1568.0, CAPACITY: 0.0}
    intervals = {UNDER: 900.0, BASELINE: 900.0, CAPACITY: 60.0}
    plan = fit_budget(per_run, intervals, frozenset(), 4_000_000)
    needed = (1_048_576 + 1568) * DAY / 4_000_000  # 22,687 s: 378.1 min
    assert plan.intervals[UNDER] == plan.intervals[BASELINE] == 379 * 60.0
    assert (plan.intervals[UNDER] - 60) < needed <= plan.intervals[UNDER]
    assert plan.intervals[CAPACITY] == 60.0
    assert plan.planned_per_day <= 4_000_000
    assert plan.planned_per_day == pytest.approx(per_day(per_run, plan.intervals), abs=1)


def test_written_intervals_never_move_and_the_rest_fit_what_they_leave() -> None:
    """A written baseline interval stays; under is slowed to fit the remainder."""
    per_run = {UNDER: 1_000_000.0, BASELINE: 10_000.0}
    intervals = {UNDER: 900.0, BASELINE: 600.0}
    plan = fit_budget(per_run, intervals, frozenset({BASELINE}), 3_440_000)
    assert plan.intervals[BASELINE] == 600.0
    # 1,440,000 a day for baseline leaves 2,000,000: two under runs a day.
    assert plan.intervals[UNDER] == DAY / 2


def test_written_intervals_over_the_budget_are_refused_with_what_they_plan() -> None:
    """The error states the written intervals' daily tokens and the budget."""
    per_run = {UNDER: 1_048_576.0, BASELINE: 1568.0}
    with pytest.raises(OverBudget) as caught:
        fit_budget(per_run, {UNDER: 3600.0, BASELINE: 900.0}, frozenset({UNDER}), 1_000_000)
    assert str(caught.value) == "its intervals plan 25165824 tokens a day; the budget is 1000000"


def test_a_budget_the_written_intervals_fill_leaves_nothing_for_the_rest_and_is_refused() -> None:
    """Exactly full written intervals with another expensive kind to pace is an error."""
    per_run = {UNDER: 1000.0, BASELINE: 10.0}
    with pytest.raises(OverBudget):
        fit_budget(per_run, {UNDER: 864.0, BASELINE: 60.0}, frozenset({UNDER}), 100_000)


def test_a_config_with_a_budget_resolves_to_the_paced_intervals() -> None:
    """The endpoint's spec carries the budget's intervals and its planned daily tokens."""
    text = """
endpoints:
  - name: glm-prod
    url: http://10.0.0.1:8000/v1
    model: glm-5.3
    flavour: vllm
    context_window: 1048576
    max_tokens: 32
    budget: {tokens_per_day: 4000000}
"""
    [spec] = parse_config(text, env={}).resolved_endpoints()
    assert spec.interval_for(UNDER) == spec.interval_for(BASELINE) == 379 * 60.0
    # Refused at admission, over costs vLLM nothing and keeps its 15 minutes.
    assert spec.interval_for(OVER) == 900.0
    assert spec.interval_for(CAPACITY) == 60.0
    assert spec.budget_tokens_per_day == 4_000_000
    assert spec.budget_planned_per_day is not None
    assert 3_900_000 < spec.budget_planned_per_day <= 4_000_000
