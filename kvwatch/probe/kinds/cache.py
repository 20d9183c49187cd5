"""The *cache* probe: a planted document asked about cold, then from the engine's prefix cache
(:mod:`kvwatch.canary.cache` plans the steps and judges them).

Every code of the cycle is a marker, issued (stored) before the first request goes out, so
one that turns up in another probe's answer names this probe. The steps go out one after
another (each must find the previous one's pages in the cache); the abort step is streamed
and disconnected after its first chunk, and the reuse step follows at once. Control steps
are sent only when a cached step answered wrong (up to two, the second only if the first was
right). The cycle is stored as one probe: its
verdict, the usage of all its steps together, and one entry of evidence per step.

The returning session keeps the cycle's first document in memory (per endpoint, at most
:data:`kvwatch.canary.cache.KEPT_DOCUMENTS`) and asks about it again once it is
``cache.return_after`` old. A restart loses them: the first cycles after one have no
returning step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import secrets
import time
from datetime import datetime, timedelta

import structlog

from kvwatch.canary import markers
from kvwatch.canary.cache import (
    ANSWER_TOKENS,
    CONTROLS,
    Ask,
    Document,
    Sent,
    branch_of,
    control_of,
    draw_document,
    fits,
    judge_cache,
    needs_control,
    plan_cycle,
    planted,
    returning,
    step_of,
)
from kvwatch.canary.model import (
    CacheOutcome,
    Exchange,
    Judgement,
    PlannedPrompt,
    ProbeKind,
    Verdict,
)
from kvwatch.canary.scan import scan_answer
from kvwatch.engines.base import Engine
from kvwatch.probe.job import ProbeJob, Probing
from kvwatch.probe.model import EndpointState
from kvwatch.probe.prompted import mark_interrupted, with_foreign
from kvwatch.probe.result import Attempt
from kvwatch.probe.window import WindowUnknown, window_of

# The document is sized by its filler words, about one token each, not by a tokenizer: the
# probe tests the cache, not the window, and the engine's own counts are stored.
TOKEN_SOURCE = "words"
# Codes a cycle issues: four in A, two more in A' (its later facts), four in B.
CODES_PER_CYCLE = 10
# The requests a cycle may send (five steps, a returning one, the controls), sharing the
# timeout.
MAX_REQUESTS = 6 + CONTROLS

log = structlog.get_logger("kvwatch.probe")


async def probe(job: ProbeJob, io: Probing) -> Attempt:
    spec = job.target.spec
    codes = [markers.new_marker() for _ in range(CODES_PER_CYCLE)]
    planned = spec.cache_document_tokens * 5
    new = dataclasses.replace(
        job.new_probe(
            replica=io.replica,
            started=io.clock(),
            max_tokens=ANSWER_TOKENS,
            token_source=TOKEN_SOURCE,
            marker=codes[0],
            streamed=spec.stream,
        ),
        burst_markers=tuple(codes[1:]),
        planned_prompt_tokens=planned,
        target_prompt_tokens=planned,
    )
    probe_id = await io.begin(new, job.claim)
    window = await _window(job)
    if window is not None and not fits(spec.cache_document_tokens, window):
        reason = (
            f"cannot plan the canary: cache.document_tokens {spec.cache_document_tokens} "
            f"leaves no room for the answer in the {window}-token window"
        )
        return Attempt(
            new, probe_id, None, Exchange(error_detail=reason), Judgement(Verdict.ERROR, reason)
        )
    asks = _asks(job, codes, io.clock())
    plan = _plan(asks[0], codes[0], planned)
    try:
        exchange, judgement = await _cycle(job, io, asks)
    except asyncio.CancelledError:
        await mark_interrupted(io, probe_id)
        raise
    _keep(job.target.state, asks[0].document, io.clock())
    return Attempt(new, probe_id, plan, exchange, judgement)


def _asks(job: ProbeJob, codes: list[str], now: datetime) -> list[Ask]:
    """The cycle's steps: documents drawn fresh, and the returning one when one is due."""
    rng = random.Random(secrets.randbits(64))
    tokens = job.target.spec.cache_document_tokens
    a = draw_document(rng, "A", codes[0:4], tokens)
    a2 = branch_of(a, codes[4:6])
    b = draw_document(rng, "B", codes[6:10], tokens)
    asks = list(plan_cycle(a, a2, b))
    old = _due(job, now)
    if old is not None:
        asks.append(returning(old))
    return asks


def _plan(cold: Ask, marker: str, planned: int) -> PlannedPrompt:
    return PlannedPrompt(
        kind=ProbeKind.CACHE,
        messages=cold.messages(),
        marker=marker,
        planned_tokens=planned,
        target_tokens=planned,
        exact=False,
        tolerance=0,
        max_tokens=ANSWER_TOKENS,
        token_source=TOKEN_SOURCE,
    )


def _due(job: ProbeJob, now: datetime) -> Document | None:
    """The oldest kept document at least ``return_after`` old, taken out (asked once); None
    without a returning session, or when none is old enough yet. A confirmation takes none:
    it re-checks the cycle that failed."""
    after = job.target.spec.cache_return_after
    kept = job.target.state.planted
    if after is None or job.confirms is not None or not kept:
        return None
    planted_at, document = kept[0]
    if now - planted_at < timedelta(seconds=after):
        return None
    kept.popleft()
    return dataclasses.replace(document, label=f"{document.label}@{planted_at:%H:%M:%S}")


def _keep(state: EndpointState, document: Document, now: datetime) -> None:
    state.planted.append((now, document))


async def _window(job: ProbeJob) -> int | None:
    """The window the document must fit, discovered on first use like every canary's; None
    when it cannot be known now (the requests themselves then say whether they fit)."""
    try:
        return await window_of(job.target)
    except WindowUnknown:
        return None
    except Exception as exc:  # discovery down, credentials refused: the requests will tell
        log.debug("cache_window_unknown", endpoint=job.target.spec.name, error=str(exc))
        return None


async def _cycle(job: ProbeJob, io: Probing, asks: list[Ask]) -> tuple[Exchange, Judgement]:
    """Send the steps in turn, controls while a cached step answered wrong; judge them."""
    spec = job.target.spec
    engine = job.target.engine_for(job.tenant)
    timeout = spec.timeouts[ProbeKind.CACHE] / MAX_REQUESTS
    codes = planted(a.document for a in asks)
    own = list(codes)
    t0 = time.perf_counter()
    sent: list[Sent] = []
    for ask in asks:
        ex = await _send(engine, ask, spec.stream, timeout)
        sent.append(Sent(ask, ex, await with_foreign(scan_answer(ex.answer, own), io)))
    while (wrong := needs_control([step_of(s, codes) for s in sent])) is not None:
        control = control_of(asks[wrong], f"{secrets.randbits(40):010x}")
        ex = await _send(engine, control, spec.stream, timeout)
        sent.append(Sent(control, ex, await with_foreign(scan_answer(ex.answer, own), io)))
    tenant = None if job.tenant is None else job.tenant.name
    judgement = judge_cache(sent, codes, tenant=tenant)
    return _evidence(sent, judgement, time.perf_counter() - t0), judgement


async def _send(engine: Engine, ask: Ask, stream: bool, timeout: float) -> Exchange:
    aborting = ask.step == "abort"
    return await engine.chat(
        ask.messages(),
        max_tokens=ANSWER_TOKENS,
        # The abort step is always streamed: a disconnect after the first chunk is what
        # aborts a request the engine has already prefilled.
        stream=stream or aborting,
        timeout=timeout,
        hang_up_after_first_chunk=aborting,
    )


def _evidence(sent: list[Sent], judgement: Judgement, wall: float) -> Exchange:
    """The cycle as one exchange: the first step that went wrong (else the cold one), with
    the usage of every step summed (what the cycle cost the engine, and how much of it the
    cache served) and its wall time."""
    bad = (CacheOutcome.RIGHT, CacheOutcome.ABORTED)
    decisive = next(
        (s for s, c in zip(sent, judgement.cache, strict=True) if c.outcome not in bad),
        sent[0],
    ).exchange
    return dataclasses.replace(
        decisive,
        prompt_tokens=_sum([s.exchange.prompt_tokens for s in sent]),
        completion_tokens=_sum([s.exchange.completion_tokens for s in sent]),
        cached_prompt_tokens=_sum([s.exchange.cached_prompt_tokens for s in sent]),
        total_seconds=wall,
    )


def _sum(counts: list[int | None]) -> int | None:
    """The counts the engine reported, added up; None when it reported none."""
    known = [c for c in counts if c is not None]
    return sum(known) if known else None


PROBER = probe
