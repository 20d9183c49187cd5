"""What the configured canaries cost the monitored engines, per day (pure).

An *under* probe prefills almost the whole window; on a 1M-token model every 5 minutes that
is about 302M prefill tokens a day, which a team should see before deploying it. An *over*
probe costs no prefill on engines that reject at admission (they tokenize, then refuse), so
it is counted as tokenize-only.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvwatch.canary.cache import cycle_tokens
from kvwatch.canary.model import ProbeKind
from kvwatch.canary.spend import DAY, run_tokens
from kvwatch.config import EndpointSpec
from kvwatch.config.resolve import shape_of


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


def plan_costs(specs: list[EndpointSpec]) -> list[ProbeCost]:
    costs = []
    for spec in specs:
        shape = shape_of(spec)
        for kind in spec.probes:
            interval = spec.interval_for(kind)
            per_day = DAY / interval
            run = run_tokens(kind, shape)
            cache = kind is ProbeKind.CACHE
            costs.append(
                ProbeCost(
                    endpoint=spec.name,
                    kind=kind,
                    interval_seconds=interval,
                    prompt_tokens=run.prompt,
                    probes_per_day=per_day,
                    prefill_tokens_per_day=(
                        None if run.prefilled is None else run.prefilled * per_day
                    ),
                    completion_tokens_per_day=run.answered * per_day,
                    cached_prompt_tokens=(
                        cycle_tokens(
                            spec.cache_document_tokens,
                            returning=spec.cache_return_after is not None,
                        ).cached
                        if cache
                        else None
                    ),
                    returning_after_seconds=spec.cache_return_after if cache else None,
                )
            )
    return costs
