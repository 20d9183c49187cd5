"""A token budget per endpoint: what each run spends, and intervals that fit the budget (pure).

Boundary canaries cost real GPU time: an *under* probe on a 1,048,576-token window prefills
about a million tokens, so every 15 minutes that is 96 of them a day. Teams answer that cost
by probing rarely, which is how a fault goes unseen for days. A budget states what the team
will spend; kvwatch then paces the expensive kinds to it instead of the team guessing an
interval, and refuses a configuration whose written intervals alone cannot fit.

A run is counted as the engine counts it (kvwatch_canary_tokens): the prompt tokens it
prefills plus the answer tokens it may generate. An *over* probe on an engine that rejects at
admission prefills nothing (it tokenizes, then refuses); on an engine that cuts the prompt
instead (Ollama) it prefills what it keeps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kvwatch.canary.burst import ANSWER_TOKENS, cycle_prompt_tokens
from kvwatch.canary.cache import DEFAULT_DOCUMENT_TOKENS, cycle_tokens
from kvwatch.canary.model import ProbeKind
from kvwatch.canary.sizing import AcceptanceRule, target_prompt_tokens

DAY = 86_400.0
# Engines whose admission check runs before prefill (see docs/engines.md and
# docs/llamacpp-facts.md): an over-limit prompt is tokenized and refused, never prefilled.
REJECT_AT_ADMISSION = frozenset({"openai", "vllm", "sglang", "llamacpp", "tgi", "anthropic"})
# Derived intervals are whole minutes: a schedule a person can read ("every 47m").
ROUND_TO_SECONDS = 60.0


def rule_for(flavour: str) -> AcceptanceRule:
    # Mirrors the engine adapters' RULE (kvwatch.engines), which this pure module cannot
    # import: llama.cpp refuses prompt >= n_ctx, Ollama cuts a prompt over its window.
    if flavour == "llamacpp":
        return AcceptanceRule.PROMPT_BELOW_WINDOW
    if flavour == "ollama":
        return AcceptanceRule.PROMPT_UP_TO_WINDOW
    return AcceptanceRule.PROMPT_PLUS_MAX_TOKENS


@dataclass(frozen=True, slots=True)
class RunShape:
    """What one run of an endpoint's canaries is sized by."""

    flavour: str
    window: int | None
    max_tokens: int
    baseline_tokens: int
    burst_sizes: Sequence[int]
    burst_prompt_tokens: int
    cache_document_tokens: int = DEFAULT_DOCUMENT_TOKENS
    cache_returning: bool = False


@dataclass(frozen=True, slots=True)
class RunTokens:
    prompt: int | None  # tokens sent (None: the window is only known at run time)
    prefilled: int | None  # of those, prefilled by the engine
    answered: float  # answer tokens it may generate (a burst's, averaged over its sizes)

    @property
    def spent(self) -> float | None:
        return None if self.prefilled is None else self.prefilled + self.answered


def run_tokens(kind: ProbeKind, shape: RunShape) -> RunTokens:
    """Tokens one run of ``kind`` spends on the engine."""
    if kind is ProbeKind.CAPACITY:
        # Asks the engine about itself: no prompt, no answer. (Its edge probe runs only when
        # it finds a KV pool smaller than the window: an incident, not the plan.)
        return RunTokens(0, 0, 0)
    if kind is ProbeKind.BURST:
        # The solo request and N at once, N averaged over the sizes taken in turn; each
        # prompt is prefilled whole (its filler is its own: no cache hit).
        tokens = cycle_prompt_tokens(shape.burst_sizes, shape.burst_prompt_tokens)
        requests = 1 + sum(shape.burst_sizes) / len(shape.burst_sizes)
        return RunTokens(tokens, tokens, requests * ANSWER_TOKENS)
    if kind is ProbeKind.CACHE:
        # Five requests about planted documents (six with a returning session), most of
        # their prompt served from the engine's prefix cache, which is not prefilled again.
        cycle = cycle_tokens(shape.cache_document_tokens, returning=shape.cache_returning)
        return RunTokens(cycle.prompt, cycle.prompt - cycle.cached, cycle.completion)
    answered = 0 if kind is ProbeKind.OVER else shape.max_tokens
    rejects = kind is ProbeKind.OVER and shape.flavour in REJECT_AT_ADMISSION
    if shape.window is None:
        # An over probe refused at admission costs nothing whatever the window is.
        return RunTokens(None, 0 if rejects else None, answered)
    prompt = target_prompt_tokens(
        kind,
        rule=rule_for(shape.flavour),
        window=shape.window,
        max_tokens=shape.max_tokens,
        baseline_tokens=shape.baseline_tokens,
    )
    prefilled = prompt
    if kind is ProbeKind.OVER:
        prefilled = 0 if rejects else min(prompt, shape.window)
    return RunTokens(prompt, prefilled, answered)


class OverBudget(ValueError):
    """The intervals the user wrote plan more tokens a day than the budget allows."""

    def __init__(self, planned: int, budget: int) -> None:
        super().__init__(f"its intervals plan {planned} tokens a day; the budget is {budget}")
        self.planned = planned
        self.budget = budget


@dataclass(frozen=True, slots=True)
class SpendPlan:
    intervals: Mapping[ProbeKind, float]
    planned_per_day: int
    budget: int


def per_day(per_run: Mapping[ProbeKind, float], intervals: Mapping[ProbeKind, float]) -> float:
    return sum(tokens * DAY / intervals[kind] for kind, tokens in per_run.items())


def fit_budget(
    per_run: Mapping[ProbeKind, float],
    intervals: Mapping[ProbeKind, float],
    explicit: frozenset[ProbeKind],
    budget: int,
) -> SpendPlan:
    """Intervals for the kinds in ``per_run`` (tokens per run) that fit ``budget`` a day.

    Intervals written per kind (``explicit``) are the user's and never move; the other
    expensive kinds are slowed to one common interval, the shortest whole number of minutes
    that fits what the written ones leave (a kind already slower keeps its own). Raises
    :class:`OverBudget` when the written ones alone do not fit, or leave nothing for the rest.
    """
    fixed = {k: t for k, t in per_run.items() if k in explicit or t == 0}
    flexible = {k: t for k, t in per_run.items() if k not in fixed}
    fixed_spend = math.ceil(per_day(fixed, intervals))
    if fixed_spend > budget or (flexible and fixed_spend >= budget):
        raise OverBudget(fixed_spend, budget)
    chosen = dict(intervals)
    if per_day(flexible, intervals) > budget - fixed_spend:
        needed = sum(flexible.values()) * DAY / (budget - fixed_spend)
        common = math.ceil(needed / ROUND_TO_SECONDS) * ROUND_TO_SECONDS
        for kind in flexible:
            chosen[kind] = max(intervals[kind], common)
    planned = math.ceil(per_day(per_run, chosen))
    return SpendPlan(intervals=chosen, planned_per_day=planned, budget=budget)
