"""Verdict classification (DESIGN §2): pure, total, and never a pass by default.

``judge`` looks at what the engine did (an :class:`Exchange`) against what kvwatch planned
(a :class:`PlannedPrompt`) and which foreign markers the answer holds. The order of the
checks is the policy: the most specific and most severe explanation wins, and the only way
to reach ``pass`` is through an explicit positive check for the probe's kind.

A prompt that carries one marker per depth (several ``marker_depths``) passes only when the
answer recalls every one of them; any other verdict's reason then says which part of the
prompt was lost (:mod:`kvwatch.canary.localise`).

A plan sized by an estimate (``plan.exact`` false: ``tokenizer: usage``, ``tiktoken:``,
``hf:``) is judged as one. Whether a probe crossed the boundary is read from the engine's
own count against the limit (``plan.accepts_up_to``), not from the estimate: an accepted over
probe that the engine counts within its limit, or a rejected under probe it counts beyond
it, did not test the boundary (``sizing_miss``, re-planned by the runner); and the slack
allowed between planned and reported counts is the calibrated error (``plan.tolerance``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from kvwatch.canary.localise import Lost, localise, outcomes_in
from kvwatch.canary.model import (
    DepthOutcome,
    DepthResult,
    Exchange,
    ForeignMarker,
    Judgement,
    PlannedPrompt,
    ProbeKind,
    Rejection,
)
from kvwatch.canary.model import Verdict as V
from kvwatch.canary.scan import AnswerScan, cross_tenant_markers, scan_answer

__all__ = ["ESTIMATE_SHORTFALL", "cross_tenant_markers", "judge", "unbelievable_usage"]

_Make = Callable[[V, str], Judgement]
# The verdicts about what the engine read, whose reason says which part it lost.
_LOCALISED = frozenset(
    {V.MARKER_MISSING, V.TRUNCATED, V.FOREIGN_MARKER, V.CROSS_TENANT_LEAK, V.CANARY_INEFFECTIVE}
)
_LEAKS = frozenset({V.FOREIGN_MARKER, V.CROSS_TENANT_LEAK})
# On an estimated plan, an answer that recalls every marker while the engine counts fewer
# tokens than estimated is a counting difference (another vocabulary, a changed model) up to
# this share of the prompt; beyond it, or with a marker lost, it is truncation. kvwatch cannot
# tell a tail cut smaller than this from a vocabulary change by the count alone: a marker at
# depth 1.0 (marker_depths) catches it by the answer instead.
ESTIMATE_SHORTFALL = 0.15


def judge(
    plan: PlannedPrompt,
    ex: Exchange,
    foreign: Sequence[ForeignMarker] = (),
    *,
    truncates_to: int | None = None,
    tenant: str | None = None,
    scan: AnswerScan | None = None,
) -> Judgement:
    """Classify one probe. ``foreign`` are markers in the answer issued to *other* probes;
    ``scan``, the answer already read (its foreign markers then stand for ``foreign``).

    ``truncates_to`` is for an engine with no hard limit (Ollama), which cuts an over-long
    prompt down to its window instead of refusing it: that window. ``None`` (every other
    engine) means an over-limit prompt must be refused. ``tenant`` is the tenant whose
    credentials this probe was sent with (None: the endpoint's own key).
    """
    if scan is None:
        scan = scan_answer(ex.answer, plan.markers, foreign)
    doubt = unbelievable_usage(plan, ex)
    # A count that cannot be believed is no evidence of what was read, nor of drift.
    reported = None if doubt is not None else ex.prompt_tokens
    drift = None if reported is None else reported - plan.planned_tokens
    found, depths, where = _recall(plan, ex, scan, reported)
    verdict = _maker(ex, scan, found, drift, depths, where)
    if ex.transport_error is not None:
        return verdict(V.ERROR, f"transport failure ({ex.transport_error}): {ex.error_detail}")
    status = ex.status
    if status is None:
        return verdict(V.ERROR, "no HTTP status recorded")
    if status in (401, 403):
        return verdict(V.AUTH_ERROR, f"HTTP {status}: credentials refused")
    if status == 429:
        return verdict(V.THROTTLED, "HTTP 429: throttled, retry later")
    leak = _leak(scan, tenant, verdict)
    if leak is not None:
        return leak
    if plan.kind is ProbeKind.OVER:
        return _judge_over(plan, ex, verdict, truncates_to, doubt)
    return _judge_recall(plan, ex, scan, found, drift, verdict, doubt)


def _recall(
    plan: PlannedPrompt, ex: Exchange, scan: AnswerScan, reported: int | None
) -> tuple[bool, list[DepthResult], str | None]:
    """Whether the answer recalled the prompt, each depth's outcome, and (with several
    markers, some lost) the sentence saying which part of the prompt was lost."""
    if len(plan.placements) <= 1:
        return scan.answered and scan.recalled(plan.marker), [], None
    depths = outcomes_in(plan.placements, scan)
    # Several markers: the prompt was read whole only if every one came back.
    found = ex.answer is not None and all(d.outcome is DepthOutcome.FOUND for d in depths)
    lost = localise(depths, planned=plan.planned_tokens, reported=reported)
    return found, depths, lost.sentence if lost.lost is not Lost.NONE else None


def _maker(
    ex: Exchange,
    scan: AnswerScan,
    found: bool,
    drift: int | None,
    depths: list[DepthResult],
    where: str | None,
) -> _Make:
    """How a verdict and its reason become a Judgement carrying the facts it rests on."""

    def verdict(v: V, reason: str) -> Judgement:
        if where is not None and v in _LOCALISED:
            reason = f"{reason}; {where}" if v in _LEAKS else f"{reason}: {where}"
        if ex.events_after_terminator:
            # Evidence only: what followed the terminator was not read as the answer, so it
            # cannot change the verdict, but an engine that keeps talking is worth a look.
            n = ex.events_after_terminator
            reason = (
                f"{reason}; the stream went on after its terminator "
                f"({n} event{'' if n == 1 else 's'}, not read)"
            )
        return Judgement(
            v,
            reason,
            marker_found=found,
            foreign=list(scan.foreign),
            token_drift=drift,
            depths=list(depths) if ex.answer is not None else [],
        )

    return verdict


def _leak(scan: AnswerScan, tenant: str | None, verdict: _Make) -> Judgement | None:
    """A leak is proof of a broken engine whatever else happened on this request. One that
    crosses tenants is the incident itself (a customer sees another's data), so it wins."""
    crossed = scan.crossed(tenant)
    if crossed:
        first = crossed[0]
        leak = verdict(
            V.CROSS_TENANT_LEAK,
            f"answer given to tenant {tenant} holds the marker of probe {first.probe_id} "
            f"issued under tenant {first.tenant} ({first.endpoint}, "
            f"issued {first.issued_at.isoformat()})",
        )
        return dataclasses.replace(leak, crossed=tuple(crossed))
    if scan.foreign:
        first = scan.foreign[0]
        return verdict(
            V.FOREIGN_MARKER,
            f"answer holds marker of probe {first.probe_id} ({first.endpoint}, "
            f"issued {first.issued_at.isoformat()})",
        )
    return None


def unbelievable_usage(plan: PlannedPrompt, ex: Exchange) -> str | None:
    """Why the engine's usage report cannot be believed, naming the value; None if it can.

    A count that is no count (negative, fractional, a string...) is recorded as such by the
    adapter. A prompt count past the window the probe was sized against is no counting drift
    either: no engine that honours the window read that much. A prompt planned past the
    window (an over probe) may be read whole, where the window is not enforced, but no engine
    reads more than the prompt it was sent (within the plan's tolerance).
    """
    if ex.unusable_usage is not None:
        return ex.unusable_usage
    reported, window = ex.prompt_tokens, plan.window
    if reported is None or window is None:
        return None
    prompt = plan.planned_tokens + plan.tolerance
    if reported <= max(window, prompt):
        return None
    if prompt > window:
        return (
            f"prompt_tokens {reported} for a {plan.planned_tokens}-token prompt "
            f"on a {window}-token window"
        )
    return f"prompt_tokens {reported} on a {window}-token window"


def _doubted(doubt: str) -> str:
    return f"the engine's usage report cannot be believed: {doubt}"


def _judge_over(
    plan: PlannedPrompt,
    ex: Exchange,
    verdict: _Make,
    truncates_to: int | None,
    doubt: str | None,
) -> Judgement:
    status = ex.status or 0
    if 200 <= status < 300:
        if ex.stream_error_frame:
            return verdict(V.WRONG_REJECTION, "over-limit prompt got 200 with an error frame")
        if not ex.body_parsed:
            # A 2xx that is no completion (an HTML error page, garbage) did not serve the
            # prompt, but did not refuse it properly either.
            return verdict(
                V.WRONG_REJECTION,
                f"over-limit prompt got HTTP {status} without a completion: "
                f"{ex.error_detail or 'unusable body'}",
            )
        if truncates_to is not None:
            if doubt is not None:
                # The cut is the only thing this probe can show, and only usage shows it.
                return verdict(V.ERROR, _doubted(doubt))
            return _judge_cut(plan, ex, verdict, truncates_to)
        accepted = f"over-limit prompt accepted with HTTP {status}"
        # Accepting is the finding whatever the engine counted; a count it cannot mean is
        # said too, so the evidence does not rest on it.
        if doubt is not None:
            return verdict(V.OVER_ACCEPTED, f"{accepted}; {_doubted(doubt)}")
        missed = _missed_over(plan, ex)
        if missed is not None:
            return verdict(V.SIZING_MISS, missed)
        return verdict(V.OVER_ACCEPTED, f"{accepted}{_counted(plan, ex)}")
    if 400 <= status < 500 and ex.rejection is Rejection.CONTEXT_LENGTH:
        return verdict(V.PASS, f"rejected with HTTP {status} context-length error")
    if 400 <= status < 500:
        return verdict(V.WRONG_REJECTION, f"rejected with HTTP {status}, not as context length")
    return verdict(V.WRONG_REJECTION, f"over-limit prompt answered HTTP {status}")


def _judge_cut(plan: PlannedPrompt, ex: Exchange, verdict: _Make, window: int) -> Judgement:
    """An answered over probe on an engine that truncates by design instead of refusing.

    Such an engine cannot prove it enforces a limit; what it can prove is that it read no
    more than its window. The engine's own count shows that; a leak was ruled out before.
    """
    planned, reported = plan.planned_tokens, ex.prompt_tokens
    if reported is None:
        return verdict(
            V.ERROR,
            "over-limit prompt answered without usage: a truncated prompt cannot be told "
            "from one read whole",
        )
    if reported < planned and reported <= window:
        # With an estimated count the prompt may have fit after all; either way the engine
        # read no more than its window, which is all this probe can show on such an engine.
        return verdict(
            V.OVER_TRUNCATED,
            f"engine read {reported} of {planned} planned prompt tokens, no more than its "
            f"{window}-token window: it truncates instead of refusing",
        )
    if reported > window:
        return verdict(
            V.OVER_ACCEPTED,
            f"engine read {reported} prompt tokens, more than its {window}-token window",
        )
    return verdict(
        V.OVER_ACCEPTED,
        f"over-limit prompt read whole ({reported} of {planned} tokens), not truncated",
    )


def _judge_recall(
    plan: PlannedPrompt,
    ex: Exchange,
    scan: AnswerScan,
    found: bool,
    drift: int | None,
    verdict: _Make,
    doubt: str | None,
) -> Judgement:
    status = ex.status or 0
    if 400 <= status < 500:
        return _judge_rejected(plan, ex, verdict, status)
    if not 200 <= status < 300:
        return verdict(V.ERROR, _http(status, ex.error_detail, "server error"))
    if ex.stream_error_frame:
        return verdict(V.STREAM_ERROR, "200 stream carried an error frame")
    if ex.streamed and not ex.stream_terminated:
        return verdict(V.STREAM_ERROR, "stream ended without its terminator")
    if not ex.body_parsed or ex.answer is None:
        return verdict(V.ERROR, f"unusable 2xx body: {ex.error_detail or 'no answer'}")
    if doubt is not None:
        # Neither a cut nor a whole read can be told from a count the engine cannot mean.
        return verdict(V.ERROR, _doubted(doubt))
    if ex.prompt_tokens is None:
        # Without usage nothing proves the engine read the whole prompt.
        return verdict(V.ERROR, "engine reported no usage.prompt_tokens")
    assert drift is not None
    if drift < -plan.tolerance:
        if found and not plan.exact and -drift <= ESTIMATE_SHORTFALL * plan.planned_tokens:
            return _counted_short(plan, ex, verdict)
        return verdict(
            V.TRUNCATED,
            f"engine read {ex.prompt_tokens} of {plan.planned_tokens} prompt tokens"
            + _estimated(plan),
        )
    if not found:
        return _not_recalled(plan, scan, verdict)
    if drift > plan.tolerance:
        # More tokens than planned, and no more than the window holds, is a counting
        # problem, never an incident (DESIGN §3).
        return verdict(
            V.PASS,
            f"marker recalled; usage drift +{drift} tokens beyond tolerance: recalibrate",
        )
    return verdict(V.PASS, "marker recalled")


def _judge_rejected(plan: PlannedPrompt, ex: Exchange, verdict: _Make, status: int) -> Judgement:
    """A 4xx: an under probe refused as too long (or sized past the limit), else an error."""
    if plan.kind is ProbeKind.UNDER and ex.rejection is Rejection.CONTEXT_LENGTH:
        missed = _missed_under(plan, ex)
        if missed is not None:
            return verdict(V.SIZING_MISS, missed)
        return verdict(
            V.UNDER_REJECTED,
            f"{plan.planned_tokens}-token prompt rejected as too long (HTTP {status})"
            + _counted(plan, ex),
        )
    return verdict(V.ERROR, _http(status, ex.error_detail, "request rejected"))


def _not_recalled(plan: PlannedPrompt, scan: AnswerScan, verdict: _Make) -> Judgement:
    """A 2xx read whole by the count whose answer lacks a marker."""
    if plan.kind is ProbeKind.BASELINE:
        what = "not every marker" if len(plan.placements) > 1 else "marker not"
        return verdict(V.CANARY_INEFFECTIVE, f"{what} recalled even from a short prompt")
    if len(plan.placements) > 1:
        recalled = sum(1 for m in plan.markers if scan.recalled(m))
        return verdict(
            V.MARKER_MISSING,
            f"200 but the answer lacks {len(plan.markers) - recalled} of "
            f"{len(plan.markers)} markers",
        )
    return verdict(V.MARKER_MISSING, "200 but the answer lacks the marker")


def _counted_short(plan: PlannedPrompt, ex: Exchange, verdict: _Make) -> Judgement:
    """Every marker came back, on an estimated plan, and the engine counted fewer tokens than
    estimated beyond the calibrated error but within :data:`ESTIMATE_SHORTFALL`: the
    estimate missed, the prompt was read. An under probe so placed did not test the
    boundary (re-planned); any other probe passes, and the count recalibrates the estimate."""
    reported = ex.prompt_tokens or 0
    share = (plan.planned_tokens - reported) / plan.planned_tokens
    counted = (
        f"the engine counted {reported} prompt tokens where kvwatch estimated "
        f"{plan.planned_tokens} ({share:.1%} fewer, beyond the calibrated error of "
        f"{plan.tolerance}) and the answer recalled every marker"
    )
    if plan.kind is ProbeKind.UNDER and plan.accepts_up_to is not None:
        return verdict(
            V.SIZING_MISS,
            f"{counted}: the estimate missed, so the prompt fell short of the boundary; "
            "re-planning with the engine's count",
        )
    return verdict(V.PASS, f"marker recalled; {counted}: recalibrating")


def _missed_over(plan: PlannedPrompt, ex: Exchange) -> str | None:
    """Why an accepted over probe proves nothing, or None when it proves the limit is not
    enforced: planned by an estimate, and the engine's own count fits its limit."""
    limit, reported = plan.accepts_up_to, ex.prompt_tokens
    if plan.exact or limit is None or reported is None or reported > limit:
        return None
    return (
        f"the engine counted {reported} prompt tokens where kvwatch estimated "
        f"{plan.planned_tokens}: within its limit of {limit}, so it was right to accept; "
        "re-planning with the engine's count"
    )


def _missed_under(plan: PlannedPrompt, ex: Exchange) -> str | None:
    """Why a rejected under probe proves nothing, or None when it proves the window is not
    served: planned by an estimate, and the engine's own count (or, when it states none, a
    first attempt) says the prompt did not fit the limit the probe was sized against."""
    limit, stated = plan.accepts_up_to, ex.stated_prompt_tokens
    if plan.exact or limit is None:
        return None
    if stated is not None:
        if stated <= limit:
            return None
        return (
            f"the engine counted {stated} prompt tokens where kvwatch estimated "
            f"{plan.planned_tokens}: over its limit of {limit}, so it was right to refuse; "
            "re-planning with the engine's count"
        )
    if plan.attempt > 0:
        return None
    return (
        f"{plan.planned_tokens}-token prompt (estimated) rejected as too long, and the engine "
        "states no count: re-planning smaller before judging"
    )


def _counted(plan: PlannedPrompt, ex: Exchange) -> str:
    """What the verdict rests on when the plan was an estimate: the engine's own count."""
    if plan.exact:
        return ""
    count = ex.prompt_tokens if ex.prompt_tokens is not None else ex.stated_prompt_tokens
    limit = "" if plan.accepts_up_to is None else f", limit {plan.accepts_up_to}"
    if count is None:
        return f" (planned by estimate at {plan.planned_tokens}; the engine stated no count)"
    return (
        f" (the engine counted {count} prompt tokens{limit}; "
        f"kvwatch estimated {plan.planned_tokens})"
    )


def _estimated(plan: PlannedPrompt) -> str:
    if plan.exact:
        return ""
    return f" (planned by estimate; a miss of up to {plan.tolerance} tokens is calibration error)"


def _http(status: int, detail: str | None, fallback: str) -> str:
    """``HTTP 503: <detail>``, without doubling a prefix the adapter already wrote."""
    text = detail or fallback
    return text if text.startswith(f"HTTP {status}") else f"HTTP {status}: {text}"
