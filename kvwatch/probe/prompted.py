"""The path every canary kind shares: record → calibrate → plan → send → scan → judge → learn.

A kind differs only in how large its prompt is, how its answer is judged, and what the plan
promises about acceptance; :class:`PromptProber` takes those three and is the kind's
:class:`~kvwatch.probe.job.Prober`. The probe row is written (state ``running``) before
planning, since planning may call the engine (tokenize) and the row must exist before
anything goes out; what planning settles is stored with the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from kvwatch.canary import markers
from kvwatch.canary.model import Exchange, Judgement, Placement, PlannedPrompt, Verdict
from kvwatch.canary.planning import PlanningError, plan_prompt
from kvwatch.canary.scan import AnswerScan, scan_answer
from kvwatch.canary.sizing import SizingError
from kvwatch.engines.base import EngineAuthError
from kvwatch.limits import short
from kvwatch.probe import calibration
from kvwatch.probe.job import ProbeJob, Probing
from kvwatch.probe.result import Attempt
from kvwatch.probe.window import WindowUnknown, window_of
from kvwatch.store.errors import StoreError, StoreUnavailable
from kvwatch.tokens.measure import read_stated_count

log = structlog.get_logger("kvwatch.probe")

# The prompt tokens a kind aims at, given the window and the margin an estimate keeps.
Size = Callable[[ProbeJob, int, int], Awaitable[int]]
# A kind's verdict on what came back, from the answer scanned once.
Judge = Callable[[ProbeJob, PlannedPrompt, Exchange, AnswerScan], Judgement]
# What the plan promises once sized (e.g. the largest prompt the engine accepts).
Settle = Callable[[ProbeJob, PlannedPrompt, int], PlannedPrompt]


def as_planned(job: ProbeJob, plan: PlannedPrompt, window: int) -> PlannedPrompt:
    return plan


@dataclass(frozen=True, slots=True)
class PromptProber:
    size: Size
    judge: Judge
    settle: Settle = as_planned

    async def __call__(self, job: ProbeJob, io: Probing) -> Attempt:
        spec = job.target.spec
        # Several depths: one marker at each, so the answer shows which part of the prompt
        # the engine read. Every one is issued and stored like the first.
        placements = (
            tuple(Placement(d, markers.new_marker()) for d in sorted(spec.marker_depths))
            if len(spec.marker_depths) > 1
            else ()
        )
        marker = placements[0].marker if placements else markers.new_marker()
        new = job.new_probe(
            replica=io.replica,
            started=io.clock(),
            max_tokens=spec.max_tokens,
            token_source=job.target.counter.source,
            marker=marker,
            streamed=spec.stream,
            placements=placements,
        )
        probe_id = await io.begin(new, job.claim)
        try:
            plan = await self._plan(job, marker, placements, io)
            if isinstance(plan, Judgement):
                exchange = Exchange(error_detail=plan.reason)
                return Attempt(new, probe_id, None, exchange, plan)
            new = dataclasses.replace(
                new,
                planned_prompt_tokens=plan.planned_tokens,
                target_prompt_tokens=plan.target_tokens,
                token_source=plan.token_source,
                tokenize_calls=plan.tokenize_calls,
                marker_depth=plan.marker_depth,
            )
            exchange, judgement = await self._send(job, plan, io)
        except asyncio.CancelledError:
            await mark_interrupted(io, probe_id)
            raise
        return Attempt(new, probe_id, plan, exchange, judgement)

    async def _plan(
        self, job: ProbeJob, marker: str, placements: tuple[Placement, ...], io: Probing
    ) -> PlannedPrompt | Judgement:
        """The canary's plan, or the verdict of a canary that could not be planned."""
        try:
            await calibration.ready(job.target, io)
            return await self._planned(job, marker, placements)
        except EngineAuthError as exc:
            return Judgement(Verdict.AUTH_ERROR, f"cannot plan the canary: {exc}")
        except (PlanningError, SizingError, WindowUnknown) as exc:
            return Judgement(Verdict.ERROR, f"cannot plan the canary: {exc}")
        except Exception as exc:  # tokenize endpoint down, garbage from it...
            reason = f"cannot plan the canary: {type(exc).__name__}: {short(str(exc))}"
            return Judgement(Verdict.ERROR, reason)

    async def _planned(
        self, job: ProbeJob, marker: str, placements: tuple[Placement, ...]
    ) -> PlannedPrompt:
        target, spec = job.target, job.target.spec
        window = await window_of(target)
        counter = target.counter
        # An estimated count keeps a margin of its calibrated error so that error cannot
        # cross the boundary; a re-plan after a sizing miss widens it.
        margin = 0 if counter.exact else counter.tolerance(window) * (1 + job.attempt)
        tokens = await self.size(job, window, margin)
        rng = random.Random(secrets.randbits(64))
        if placements:
            depth = placements[0].depth
        else:
            depth = rng.choice(spec.marker_depths) if spec.marker_depths else 0.0
        plan = await plan_prompt(
            job.kind,
            counter=counter,
            target_tokens=tokens,
            marker=marker,
            max_tokens=spec.max_tokens,
            rng=rng,
            depth=depth,
            placements=placements,
            window=window,
        )
        return self.settle(job, plan, window)

    async def _send(
        self, job: ProbeJob, plan: PlannedPrompt, io: Probing
    ) -> tuple[Exchange, Judgement]:
        target, spec = job.target, job.target.spec
        exchange = await target.engine_for(job.tenant).chat(
            plan.messages,
            max_tokens=plan.max_tokens,
            stream=spec.stream,
            timeout=spec.timeouts[job.kind],
            progress=job.progress,
        )
        read_stated_count(exchange)
        scan = await with_foreign(scan_answer(exchange.answer, plan.markers), io)
        judgement = self.judge(job, plan, exchange, scan)
        if plan.note and judgement.verdict is not Verdict.PASS:
            judgement = dataclasses.replace(judgement, reason=f"{judgement.reason}; {plan.note}")
        # Only a believable count of the whole prompt teaches (see calibration.learn).
        await calibration.learn(target, plan, exchange, judgement.verdict, io)
        return exchange, judgement


async def with_foreign(scan: AnswerScan, io: Probing) -> AnswerScan:
    """The scan with the issued markers among its codes looked up."""
    unknown = scan.unknown
    if not unknown:
        return scan
    try:
        issued = await asyncio.to_thread(io.store.lookup_markers, unknown)
    except StoreUnavailable as exc:
        # Cannot name the origin now; the answer still lacks its own marker, so the
        # verdict stays critical (marker_missing) rather than passing.
        log.warning("database_unavailable", during="lookup_markers", error=str(exc))
        return scan
    return scan.resolved(issued)


async def mark_interrupted(io: Probing, probe_id: int | None) -> None:
    """A probe cancelled mid-flight (kvwatch stopping): its running row says so, shielded so
    that the cancellation does not cut the write short, and the interrupted counter counts it."""
    if probe_id is not None:
        with contextlib.suppress(StoreError):
            await asyncio.shield(
                asyncio.to_thread(
                    io.store.interrupt_running,
                    probe_ids=[probe_id],
                    reason="kvwatch stopped before the probe finished",
                )
            )
    io.metrics.interrupted.inc()
