"""The scheduled canaries around the window: *under* (the largest prompt it must serve whole),
*over* (one past it, which it must refuse or cut), *baseline* (a short one the model must
recall from at all)."""

from __future__ import annotations

import dataclasses

from kvwatch.canary.model import Exchange, Judgement, PlannedPrompt, ProbeKind
from kvwatch.canary.scan import AnswerScan
from kvwatch.canary.sizing import largest_accepted, target_prompt_tokens
from kvwatch.canary.verdicts import judge
from kvwatch.probe.job import ProbeJob
from kvwatch.probe.prompted import PromptProber


async def size(job: ProbeJob, window: int, margin: int) -> int:
    spec = job.target.spec
    return target_prompt_tokens(
        job.kind,
        rule=job.target.engine.rule,
        window=window,
        max_tokens=spec.max_tokens,
        baseline_tokens=spec.baseline_tokens,
        margin=margin,
    )


def verdict(job: ProbeJob, plan: PlannedPrompt, exchange: Exchange, scan: AnswerScan) -> Judgement:
    target = job.target
    # An engine without a hard limit is judged on how it cut the over prompt: to the window
    # the probe was sized against.
    cut_to = None if target.engine.hard_limit else target.window
    tenant = None if job.tenant is None else job.tenant.name
    return judge(plan, exchange, truncates_to=cut_to, tenant=tenant, scan=scan)


def settle(job: ProbeJob, plan: PlannedPrompt, window: int) -> PlannedPrompt:
    """Under and over probes know the largest prompt the engine accepts: whether an
    estimated size crossed the boundary is judged against it (sizing_miss)."""
    if job.kind not in (ProbeKind.UNDER, ProbeKind.OVER):
        return plan
    spec = job.target.spec
    limit = largest_accepted(job.target.engine.rule, window=window, max_tokens=spec.max_tokens)
    return dataclasses.replace(plan, accepts_up_to=limit, attempt=job.attempt)


PROBER = PromptProber(size=size, judge=verdict, settle=settle)
