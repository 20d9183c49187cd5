"""A *bisect* probe: one step of the served-window search, a prompt of exactly the size the
search asks for, judged as an under probe of that size would be."""

from __future__ import annotations

import dataclasses

from kvwatch.canary.model import Exchange, Judgement, PlannedPrompt, ProbeKind
from kvwatch.canary.scan import AnswerScan
from kvwatch.canary.sizing import SizingError
from kvwatch.canary.verdicts import judge
from kvwatch.probe.job import ProbeJob
from kvwatch.probe.prompted import PromptProber


async def size(job: ProbeJob, window: int, margin: int) -> int:
    if job.size is None:
        raise SizingError("a bisect probe needs a prompt size")
    # Exactly the size the search asked for: the planned count is what it judges.
    return job.size


def verdict(job: ProbeJob, plan: PlannedPrompt, exchange: Exchange, scan: AnswerScan) -> Judgement:
    # Served whole or not, exactly as an under probe of this size would be.
    as_under = dataclasses.replace(plan, kind=ProbeKind.UNDER)
    tenant = None if job.tenant is None else job.tenant.name
    return judge(as_under, exchange, tenant=tenant, scan=scan)


PROBER = PromptProber(size=size, judge=verdict)
