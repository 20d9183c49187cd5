"""What the configured canaries cost the monitored engines, per day (pure).

An *under* probe prefills almost the whole window; on a 1M-token model every 5 minutes that
is about 302M prefill tokens a day, which a team should see before deploying it. An *over*
probe costs no prefill on engines that reject at admission (they tokenize, then refuse), so
it is counted as tokenize-only.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvwatch.canary.burst import ANSWER_TOKENS, cycle_prompt_tokens
from kvwatch.canary.cache import cycle_tokens
from kvwatch.canary.model import ProbeKind
from kvwatch.canary.sizing import AcceptanceRule, target_prompt_tokens
from kvwatch.config import EndpointSpec

DAY = 86_400.0

# Engines whose admission check runs before prefill (see docs/engines.md and
# docs/llamacpp-facts.md): an over-limit prompt is tokenized and refused, never prefilled.
REJECT_AT_ADMISSION = frozenset({"openai", "vllm", "sglang", "llamacpp", "tgi", "anthropic"})


@dataclass(frozen=True, slots=True)
class ProbeCost:
    endpoint: str
    kind: ProbeKind
    interval_seconds: float
    prompt_tokens: int | None  # per probe; None when the window is only known at run time
    probes_per_day: float
    prefill_tokens_per_day: float | None
    completion_tokens_per_day: float
    # The cache probe: prompt tokens per cycle the engine should serve from its prefix cache
    # (not prefilled again), and the age of the document its returning session asks about.
    cached_prompt_tokens: int | None = None
    returning_after_seconds: float | None = None


def rule_for(flavour: str) -> AcceptanceRule:
    # Mirrors the engine adapters' RULE (kvwatch.engines), which this pure module cannot
    # import: llama.cpp refuses prompt >= n_ctx, Ollama cuts a prompt over its window.
    if flavour == "llamacpp":
        return AcceptanceRule.PROMPT_BELOW_WINDOW
    if flavour == "ollama":
        return AcceptanceRule.PROMPT_UP_TO_WINDOW
    return AcceptanceRule.PROMPT_PLUS_MAX_TOKENS


def plan_costs(specs: list[EndpointSpec]) -> list[ProbeCost]:
    costs = []
    for spec in specs:
        per_day = DAY / spec.interval_seconds
        for kind in spec.probes:
            if kind is ProbeKind.CAPACITY:
                # Asks the engine about itself: no prompt, no answer. (Its edge probe runs
                # only when it finds a KV pool smaller than the window: an incident.)
                costs.append(ProbeCost(spec.name, kind, spec.interval_seconds, 0, per_day, 0, 0))
                continue
            if kind is ProbeKind.BURST:
                costs.append(_burst_cost(spec, per_day))
                continue
            if kind is ProbeKind.CACHE:
                costs.append(_cache_cost(spec, per_day))
                continue
            tokens = None
            if spec.context_window is not None:
                tokens = target_prompt_tokens(
                    kind,
                    rule=rule_for(spec.flavour),
                    window=spec.context_window,
                    max_tokens=spec.max_tokens,
                    baseline_tokens=spec.baseline_tokens,
                )
            prefilled = tokens
            if kind is ProbeKind.OVER and spec.flavour in REJECT_AT_ADMISSION:
                prefilled = 0
            elif kind is ProbeKind.OVER and tokens is not None and spec.context_window:
                # An engine that cuts the prompt instead (Ollama) prefills what it keeps.
                prefilled = min(tokens, spec.context_window)
            answered = kind is not ProbeKind.OVER
            costs.append(
                ProbeCost(
                    endpoint=spec.name,
                    kind=kind,
                    interval_seconds=spec.interval_seconds,
                    prompt_tokens=tokens,
                    probes_per_day=per_day,
                    prefill_tokens_per_day=None if prefilled is None else prefilled * per_day,
                    completion_tokens_per_day=spec.max_tokens * per_day if answered else 0.0,
                )
            )
    return costs


def _burst_cost(spec: EndpointSpec, per_day: float) -> ProbeCost:
    """A burst cycle: the solo request and N at once, N averaged over the sizes it takes in
    turn; each prompt is prefilled whole (its filler is its own: no cache hit)."""
    tokens = cycle_prompt_tokens(spec.burst_sizes, spec.burst_prompt_tokens)
    requests = 1 + sum(spec.burst_sizes) / len(spec.burst_sizes)
    return ProbeCost(
        endpoint=spec.name,
        kind=ProbeKind.BURST,
        interval_seconds=spec.interval_seconds,
        prompt_tokens=tokens,
        probes_per_day=per_day,
        prefill_tokens_per_day=tokens * per_day,
        completion_tokens_per_day=requests * ANSWER_TOKENS * per_day,
    )


def _cache_cost(spec: EndpointSpec, per_day: float) -> ProbeCost:
    """A cache cycle: five requests about planted documents (six with a returning session),
    most of their prompt served from the engine's prefix cache, which is not prefilled."""
    cycle = cycle_tokens(spec.cache_document_tokens, returning=spec.cache_return_after is not None)
    return ProbeCost(
        endpoint=spec.name,
        kind=ProbeKind.CACHE,
        interval_seconds=spec.interval_seconds,
        prompt_tokens=cycle.prompt,
        probes_per_day=per_day,
        prefill_tokens_per_day=(cycle.prompt - cycle.cached) * per_day,
        completion_tokens_per_day=cycle.completion * per_day,
        cached_prompt_tokens=cycle.cached,
        returning_after_seconds=spec.cache_return_after,
    )
