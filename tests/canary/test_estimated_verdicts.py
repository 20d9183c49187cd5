"""A plan sized by an estimate is judged by the engine's own count, never by the estimate."""

from __future__ import annotations

import dataclasses

import pytest

from kvwatch.canary.model import (
    Exchange,
    Message,
    PlannedPrompt,
    ProbeKind,
    Rejection,
    Verdict,
)
from kvwatch.canary.verdicts import ESTIMATE_SHORTFALL, judge

MARKER = "KVW-7F3K-9QX2-M4TD"
LIMIT = 8160  # window 8192, max_tokens 32, prompt + max_tokens <= window
UN, OV, BL = ProbeKind.UNDER, ProbeKind.OVER, ProbeKind.BASELINE


def estimated(kind: ProbeKind, planned: int, *, tolerance: int = 100, attempt: int = 0):
    return PlannedPrompt(
        kind=kind,
        messages=(Message("user", "…"),),
        marker=MARKER,
        planned_tokens=planned,
        target_tokens=planned,
        exact=False,
        tolerance=tolerance,
        max_tokens=32,
        token_source="usage",
        accepts_up_to=None if kind is BL else LIMIT,
        attempt=attempt,
    )


def answered(prompt_tokens: int, answer: str = f"The code is {MARKER}.") -> Exchange:
    return Exchange(
        status=200,
        answer=answer,
        body_parsed=True,
        prompt_tokens=prompt_tokens,
        completion_tokens=12,
        streamed=True,
        stream_terminated=True,
        finish_reason="stop",
    )


def refused(stated: int | None) -> Exchange:
    return Exchange(
        status=400,
        rejection=Rejection.CONTEXT_LENGTH,
        error_body='{"error": "too long"}',
        stated_prompt_tokens=stated,
    )


CASES = [
    # An over probe the engine counts within its limit was right to accept: no page.
    (OV, 8174, answered(8155), Verdict.SIZING_MISS),
    (OV, 8174, answered(LIMIT), Verdict.SIZING_MISS),
    # Counted over the limit and accepted: the limit is not enforced, whatever the estimate.
    (OV, 8174, answered(LIMIT + 1), Verdict.OVER_ACCEPTED),
    (OV, 8174, refused(8180), Verdict.PASS),
    # An under probe the engine counts over its limit was right to be refused.
    (UN, 8100, refused(8200), Verdict.SIZING_MISS),
    (UN, 8100, refused(8100), Verdict.UNDER_REJECTED),
    # No count stated: re-planned once smaller before it is judged.
    (UN, 8100, refused(None), Verdict.SIZING_MISS),
    # Counted fewer than estimated, every marker recalled: the estimate missed.
    (UN, 8000, answered(7600), Verdict.SIZING_MISS),
    (BL, 1600, answered(1500), Verdict.PASS),
    # A marker lost with fewer tokens counted, or a gap past any vocabulary: truncation.
    (UN, 8000, answered(7600, answer="I do not know."), Verdict.TRUNCATED),
    (UN, 8000, answered(1), Verdict.TRUNCATED),
    (UN, 8000, answered(int(8000 * (1 - ESTIMATE_SHORTFALL)) - 1), Verdict.TRUNCATED),
    (BL, 1600, answered(1, answer="I do not know."), Verdict.TRUNCATED),
    # Within the calibrated error, nothing to see.
    (UN, 8000, answered(7950), Verdict.PASS),
]


@pytest.mark.parametrize(("kind", "planned", "exchange", "verdict"), CASES)
def test_an_estimated_plan_is_judged_by_the_engines_count(
    kind: ProbeKind, planned: int, exchange: Exchange, verdict: Verdict
) -> None:
    """Each case: the verdict the engine's own count supports, not the estimate's."""
    assert judge(estimated(kind, planned), exchange).verdict is verdict


def test_a_second_refusal_without_a_count_is_judged() -> None:
    """After a re-plan, a refusal the engine gives no count for is under_rejected."""
    again = estimated(UN, 7900, attempt=1)
    assert judge(again, refused(None)).verdict is Verdict.UNDER_REJECTED


@pytest.mark.parametrize(
    ("kind", "exchange"),
    [(OV, answered(8155)), (UN, refused(8200)), (UN, answered(7600))],
)
def test_an_exact_plan_keeps_its_verdicts(kind: ProbeKind, exchange: Exchange) -> None:
    """A count from the engine's own tokenizer is never excused as an estimate."""
    plan = dataclasses.replace(estimated(kind, 8174 if kind is OV else 8000), exact=True)
    assert judge(plan, exchange).verdict is not Verdict.SIZING_MISS


def test_the_reason_names_both_counts_and_the_limit() -> None:
    """A sizing miss says what the engine counted, what kvwatch estimated and the limit."""
    reason = judge(estimated(OV, 8174), answered(8155)).reason
    assert "8155" in reason and "8174" in reason and str(LIMIT) in reason
    accepted = judge(estimated(OV, 8174), answered(8200)).reason
    assert "the engine counted 8200 prompt tokens, limit 8160" in accepted
