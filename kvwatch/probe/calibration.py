"""Estimated token counts learn from the engine: restore, measure, learn, save.

An estimating counter (``tokenizer: usage``, ``tiktoken:``, ``hf:``) sizes canaries from an
estimate corrected by what the engine's counts taught (:mod:`kvwatch.tokens.calibration`).
Before its first canary it starts from the calibration stored for the endpoint, or learns
the engine's count from one cheap request; afterwards every believable count of a whole
prompt teaches it, and what changed is stored.
"""

from __future__ import annotations

import asyncio

import structlog

from kvwatch.canary.model import Exchange, PlannedPrompt, ProbeKind, Verdict
from kvwatch.limits import short
from kvwatch.probe.job import Probing
from kvwatch.probe.model import Target
from kvwatch.probe.window import window_of
from kvwatch.store.errors import StoreError
from kvwatch.store.records import CalibrationRecord
from kvwatch.tokens.calibration import Calibration, Calibrations
from kvwatch.tokens.estimate import EstimatingCounter
from kvwatch.tokens.measure import engine_count, measure

log = structlog.get_logger("kvwatch.probe")

# Verdicts whose reported count is the engine's count of the whole prompt as sent (not of a
# cut or swapped one): only these teach an estimate.
COUNT_TRUSTED = frozenset(
    {Verdict.PASS, Verdict.SIZING_MISS, Verdict.CANARY_INEFFECTIVE, Verdict.UNDER_REJECTED}
)


async def ready(target: Target, io: Probing) -> None:
    """Make an estimating counter ready to size a canary: start from the calibration
    stored for the endpoint (once per process), and with nothing learnt yet, learn the
    engine's count from one cheap request first. An uncalibrated estimate can be off by
    several times (another vocabulary), and no verdict about a count could stand on it."""
    counter = target.counter
    if not isinstance(counter, EstimatingCounter):
        return
    async with counter.lock:
        if not counter.restored:
            counter.restored = True
            await _restore(target, counter, io)
        # One calibration request per process: an engine whose count is no count (a
        # collapsed template reports 3 tokens) is not asked again before every probe; the
        # probes' own reports calibrate it once they are believable.
        if counter.calibrations.calibrated or counter.measured:
            return
        counter.measured = True
        try:
            await _calibrate(target, counter, io)
        except Exception as exc:  # planning it failed: size this probe uncalibrated
            log.warning(
                "calibration_failed",
                endpoint=target.spec.name,
                token_source=counter.source,
                reason=f"{type(exc).__name__}: {short(str(exc))}",
            )


async def _restore(target: Target, counter: EstimatingCounter, io: Probing) -> None:
    try:
        stored = await asyncio.to_thread(io.store.calibrations, target.spec.name)
    except StoreError as exc:
        log.warning("calibration_not_read", endpoint=target.spec.name, error=str(exc))
        stored = []
    restored = tuple(
        (r.size_class, Calibration(r.ratio, r.error, r.observations))
        for r in stored
        if r.token_source == counter.source and r.observations > 0
    )
    if restored:
        counter.calibrations = Calibrations(restored)


async def _calibrate(target: Target, counter: EstimatingCounter, io: Probing) -> None:
    """Learn the engine's count from one cheap canary-like request (not a probe)."""
    spec = target.spec
    window = await window_of(target)
    found = await measure(
        target.engine, counter, window=window, timeout=spec.timeouts[ProbeKind.BASELINE]
    )
    exchange, reported = found.exchange, found.reported
    if reported is None:
        log.warning(
            "calibration_failed",
            endpoint=spec.name,
            token_source=counter.source,
            status=exchange.status,
            reason=exchange.error_detail or "the engine reported no prompt token count",
        )
        return
    await _teach(target, found.planned, reported, io)
    log.info(
        "calibrated",
        endpoint=spec.name,
        token_source=counter.source,
        planned_prompt_tokens=found.planned,
        reported_prompt_tokens=reported,
        ratio=round(counter.calibrations.at(reported).ratio, 5),
    )


async def learn(
    target: Target, plan: PlannedPrompt, exchange: Exchange, verdict: Verdict, io: Probing
) -> None:
    """Teach the counter the engine's count of a prompt it planned.

    Only a count of the whole prompt as sent teaches: a cut or swapped prompt's count
    (truncated, marker_missing, over_truncated: the window, or a 1-token placeholder)
    would make every later canary of this endpoint the wrong size.
    """
    reported = engine_count(exchange)
    if reported is not None and verdict in COUNT_TRUSTED:
        await _teach(target, plan.planned_tokens, reported, io)


async def _teach(target: Target, planned: int, reported: int, io: Probing) -> None:
    """Tell the counter what the engine counted; store what an estimating one learnt."""
    counter = target.counter
    if not isinstance(counter, EstimatingCounter):
        counter.observe(planned, reported)  # exact counters ignore it
        return
    before = counter.calibrations
    counter.observe(planned, reported)
    await _save(target, counter, before, io)


async def _save(
    target: Target, counter: EstimatingCounter, before: Calibrations, io: Probing
) -> None:
    old = dict(before.by_class)
    now = io.clock()
    records = [
        CalibrationRecord(
            endpoint=target.spec.name,
            token_source=counter.source,
            size_class=size_class,
            ratio=c.ratio,
            error=c.error,
            observations=c.observations,
            updated_at=now,
        )
        for size_class, c in counter.calibrations.by_class
        if old.get(size_class) != c
    ]
    if not records:
        return
    try:
        await asyncio.to_thread(io.store.save_calibrations, records)
    except StoreError as exc:
        # Kept in memory and saved with the next report: probing goes on.
        log.warning("calibration_not_saved", endpoint=target.spec.name, error=str(exc))
