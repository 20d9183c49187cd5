"""The *capacity* check: what the engine reports (window, KV pool) against itself and the
configuration. No prompt is sent.

Nothing is stored when the engine reports no KV pool: there is nothing to compare, and a
check that cannot fail must not be recorded as a pass.
"""

from __future__ import annotations

import asyncio
import time

import structlog

from kvwatch.canary.model import Exchange, Judgement, ProbeKind, Severity, Verdict
from kvwatch.capacity import assess, edge_pool
from kvwatch.engines.base import Discovery, EngineAuthError
from kvwatch.probe.job import ProbeJob, Probing
from kvwatch.probe.model import Target
from kvwatch.probe.reported import engine_report
from kvwatch.probe.result import Attempt

log = structlog.get_logger("kvwatch.probe")


async def probe(job: ProbeJob, io: Probing) -> Attempt | None:
    target, spec = job.target, job.target.spec
    timeout = spec.timeouts[ProbeKind.CAPACITY]
    started = io.clock()
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(timeout):
            discovery = await engine_report(target)
    except EngineAuthError as exc:
        _observed(target, None)
        judgement = Judgement(Verdict.AUTH_ERROR, f"discovery refused: {exc}")
    except TimeoutError:
        _observed(target, None)
        judgement = Judgement(Verdict.ERROR, f"discovery did not answer within {timeout:.0f} s")
    else:
        _observed(target, discovery)
        target.state.discovery = discovery
        if discovery.kv_pool_tokens is None and spec.kv_pool_tokens is None:
            log.debug("capacity_unreported", endpoint=spec.name, detail=discovery.detail)
            return None
        judgement = _judge(target, discovery)
    exchange = Exchange(total_seconds=time.perf_counter() - t0)
    new = job.new_probe(
        replica=io.replica,
        started=started,
        max_tokens=0,
        token_source="discovery",
        marker="",
        streamed=False,
    )
    probe_id = await io.begin(new, job.claim)
    return Attempt(new, probe_id, None, exchange, judgement)


def _observed(target: Target, discovery: Discovery | None) -> None:
    # For the change watcher (kvwatch.changes), which compares it with the last fingerprint.
    target.state.unobserved_report = discovery
    target.state.report_unobserved = True


def _judge(target: Target, discovery: Discovery) -> Judgement:
    spec = target.spec
    findings = assess(spec.context_window, spec.kv_pool_tokens, discovery)
    critical = [f for f in findings if f.severity is Severity.CRITICAL]
    if critical:
        return Judgement(Verdict.CAPACITY_MISMATCH, critical[0].message)
    return Judgement(
        Verdict.PASS,
        "; ".join(f.message for f in findings)
        or (
            f"window {discovery.context_window or spec.context_window} fits the "
            f"KV pool {edge_pool(spec.kv_pool_tokens, discovery)}"
        ),
    )


PROBER = probe
