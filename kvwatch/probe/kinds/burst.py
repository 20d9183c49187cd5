"""The *burst* probe: a solo request, then N at once, each with its own marker and task
(:mod:`kvwatch.canary.burst` judges them).

Every marker of the cycle is issued (stored) before the first request goes out, so one that
turns up in another probe's answer names this probe, and one that turns up in another
request of the same burst is told apart from another probe's without a lookup. The cycle is
stored as one probe: its verdict, the usage of all its requests together, and one entry of
evidence per request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import secrets
import time

import structlog

from kvwatch.canary import markers
from kvwatch.canary.burst import (
    ANSWER_TOKENS,
    FIXED_TOKENS,
    BurstTask,
    Sent,
    control_of,
    draw_tasks,
    filler_pieces,
    fits,
    judge_burst,
    needs_controls,
    size_for,
)
from kvwatch.canary.model import (
    BurstOutcome,
    Exchange,
    Judgement,
    Message,
    PlannedPrompt,
    ProbeKind,
    TransportError,
    Verdict,
)
from kvwatch.canary.scan import scan_answer
from kvwatch.engines.base import Engine
from kvwatch.probe.job import ProbeJob, Probing
from kvwatch.probe.prompted import mark_interrupted, with_foreign
from kvwatch.probe.result import Attempt
from kvwatch.probe.window import WindowUnknown, window_of

# The prompt is sized by its filler words, about one token each, not by a tokenizer: a
# burst tests the batch, not the window, and the engine's own count is stored.
TOKEN_SOURCE = "words"

log = structlog.get_logger("kvwatch.probe")


async def probe(job: ProbeJob, io: Probing) -> Attempt:
    spec = job.target.spec
    size = size_for(spec.burst_sizes, _turn(job))
    issued = [markers.new_marker() for _ in range(size + 1)]
    planned = spec.burst_prompt_tokens * (size + 1)
    new = dataclasses.replace(
        job.new_probe(
            replica=io.replica,
            started=io.clock(),
            max_tokens=ANSWER_TOKENS,
            token_source=TOKEN_SOURCE,
            marker=issued[0],
            streamed=spec.stream,
        ),
        burst_markers=tuple(issued[1:]),
        planned_prompt_tokens=planned,
        target_prompt_tokens=planned,
    )
    probe_id = await io.begin(new, job.claim)
    window = await _window(job)
    if window is not None and not fits(spec.burst_prompt_tokens, window):
        reason = (
            f"cannot plan the canary: burst.prompt_tokens {spec.burst_prompt_tokens} leaves no "
            f"room for the answer in the {window}-token window"
        )
        return Attempt(
            new, probe_id, None, Exchange(error_detail=reason), Judgement(Verdict.ERROR, reason)
        )
    tasks, prompts, plan = _planned(job, issued, size, planned)
    try:
        exchange, judgement = await _cycle(job, io, tasks, prompts)
    except asyncio.CancelledError:
        await mark_interrupted(io, probe_id)
        raise
    return Attempt(new, probe_id, plan, exchange, judgement)


def _planned(
    job: ProbeJob, issued: list[str], size: int, planned: int
) -> tuple[tuple[BurstTask, ...], list[tuple[Message, ...]], PlannedPrompt]:
    """The cycle's tasks, their prompts (each with its own filler) and the plan stored with
    the probe (the solo request's prompt, the cycle's planned tokens)."""
    rng = random.Random(secrets.randbits(64))
    tasks = draw_tasks(rng, issued, size)
    words = job.target.spec.burst_prompt_tokens - FIXED_TOKENS
    prompts = [t.messages(filler_pieces(rng, words)) for t in tasks]
    plan = PlannedPrompt(
        kind=ProbeKind.BURST,
        messages=prompts[0],
        marker=issued[0],
        planned_tokens=planned,
        target_tokens=planned,
        exact=False,
        tolerance=0,
        max_tokens=ANSWER_TOKENS,
        token_source=TOKEN_SOURCE,
    )
    return tasks, prompts, plan


async def _window(job: ProbeJob) -> int | None:
    """The window the burst must fit, discovered on first use like every canary's; None
    when it cannot be known now (the requests themselves then say whether they fit)."""
    try:
        return await window_of(job.target)
    except WindowUnknown:
        return None
    except Exception as exc:  # discovery down, credentials refused: the requests will tell
        log.debug("burst_window_unknown", endpoint=job.target.spec.name, error=str(exc))
        return None


def _turn(job: ProbeJob) -> int:
    """Which size of the list this cycle takes: the slot's number (every replica agrees, and a
    confirmation re-checks the size that failed), else the endpoint's count of cycles."""
    spec, state = job.target.spec, job.target.state
    if job.slot is not None:
        return int(job.slot // spec.interval_for(ProbeKind.BURST))
    if job.confirms is None:
        state.burst_turns += 1
    return state.burst_turns - 1


async def _cycle(
    job: ProbeJob, io: Probing, tasks: tuple[BurstTask, ...], prompts: list[tuple[Message, ...]]
) -> tuple[Exchange, Judgement]:
    """Send the solo request, then the rest at once, then each wrong member again alone;
    judge them together."""
    spec = job.target.spec
    engine = job.target.engine_for(job.tenant)
    # The solo request and the burst each get half the kind's timeout; controls (a wrong
    # member's prompt again alone, one at a time) share what the two rounds left of it, so
    # a cycle stays within its timeout and its slot claim.
    budget = spec.timeouts[ProbeKind.BURST]
    t0 = time.perf_counter()
    solo = await _send(engine, prompts[0], spec.stream, budget / 2)
    rest = await asyncio.gather(*(_send(engine, p, spec.stream, budget / 2) for p in prompts[1:]))
    own = [t.marker for t in tasks]
    sent = [
        Sent(task, ex, await with_foreign(scan_answer(ex.answer, own), io))
        for task, ex in zip(tasks, [solo, *rest], strict=True)
    ]
    tenant = None if job.tenant is None else job.tenant.name
    judgement = judge_burst(sent, tenant=tenant)
    for index in needs_controls(judgement.burst):
        left = budget - (time.perf_counter() - t0)
        ex = (
            await _send(engine, prompts[index], spec.stream, left) if left > 0 else _no_time(budget)
        )
        scan = await with_foreign(scan_answer(ex.answer, own), io)
        sent.append(Sent(control_of(tasks[index]), ex, scan))
    if len(sent) > len(tasks):
        judgement = judge_burst(sent, tenant=tenant)
    return _evidence(sent, judgement, time.perf_counter() - t0), judgement


def _no_time(budget: float) -> Exchange:
    """A control the cycle had no time left for: a timeout, as if sent."""
    return Exchange(
        transport_error=TransportError.TIMEOUT,
        error_detail=f"no time left of the burst's {budget:g} s timeout",
    )


async def _send(
    engine: Engine, messages: tuple[Message, ...], stream: bool, timeout: float
) -> Exchange:
    return await engine.chat(messages, max_tokens=ANSWER_TOKENS, stream=stream, timeout=timeout)


def _evidence(sent: list[Sent], judgement: Judgement, wall: float) -> Exchange:
    """The cycle as one exchange: the first request that went wrong (else the solo one), with
    the usage of every request summed (what the cycle cost the engine) and its wall time."""
    decisive = next(
        (
            s
            for s, r in zip(sent, judgement.burst, strict=True)
            if r.outcome is not BurstOutcome.RIGHT
        ),
        sent[0],
    ).exchange
    prompt = [s.exchange.prompt_tokens for s in sent]
    completion = [s.exchange.completion_tokens for s in sent]
    return dataclasses.replace(
        decisive,
        prompt_tokens=sum(p for p in prompt if p is not None)
        if any(p is not None for p in prompt)
        else None,
        completion_tokens=(
            sum(c for c in completion if c is not None)
            if any(c is not None for c in completion)
            else None
        ),
        total_seconds=wall,
    )


PROBER = probe
