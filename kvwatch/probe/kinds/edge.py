"""The *edge* probe: a prompt just over the KV pool, inside the window, where an engine that
advertises more window than it has pages must reject or serve whole (DESIGN §2)."""

from __future__ import annotations

from kvwatch.canary.edge import judge_edge
from kvwatch.canary.model import Exchange, Judgement, PlannedPrompt
from kvwatch.canary.scan import AnswerScan
from kvwatch.canary.sizing import SizingError, edge_prompt_tokens
from kvwatch.capacity import edge_pool
from kvwatch.probe.job import ProbeJob
from kvwatch.probe.prompted import PromptProber
from kvwatch.probe.reported import engine_report


async def size(job: ProbeJob, window: int, margin: int) -> int:
    target = job.target
    discovery = target.discovery or await engine_report(target)
    pool = edge_pool(target.spec.kv_pool_tokens, discovery)
    if pool is None:
        raise SizingError("the engine reports no KV pool to probe the edge of")
    return edge_prompt_tokens(
        rule=target.engine.rule,
        window=window,
        pool=pool,
        max_tokens=target.spec.max_tokens,
        margin=margin,
    )


def verdict(job: ProbeJob, plan: PlannedPrompt, exchange: Exchange, scan: AnswerScan) -> Judgement:
    tenant = None if job.tenant is None else job.tenant.name
    return judge_edge(plan, exchange, tenant=tenant, scan=scan)


PROBER = PromptProber(size=size, judge=verdict)
