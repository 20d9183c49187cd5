"""The edge verdict table: rejected with a context-length 4xx or answered whole, else a finding."""

from __future__ import annotations

import pytest

from kvwatch.canary.edge import judge_edge
from kvwatch.canary.model import (
    Exchange,
    Message,
    PlannedPrompt,
    ProbeKind,
    Rejection,
    TransportError,
    Verdict,
)
from kvwatch.canary.sizing import AcceptanceRule, SizingError, edge_prompt_tokens

MARKER = "KVW-7Q2M-X9RT-4ABC"
PLAN = PlannedPrompt(
    kind=ProbeKind.OVER,
    messages=(Message("user", "..."),),
    marker=MARKER,
    planned_tokens=681_281,
    target_tokens=681_281,
    exact=True,
    tolerance=0,
    max_tokens=16,
)


def _ok(**kw: object) -> Exchange:
    facts: dict[str, object] = {
        "status": 200,
        "body_parsed": True,
        "answer": MARKER,
        "prompt_tokens": 681_281,
    }
    facts.update(kw)
    return Exchange(**facts)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("exchange", "verdict"),
    [
        (Exchange(status=400, rejection=Rejection.CONTEXT_LENGTH), Verdict.PASS),
        (Exchange(status=422, rejection=Rejection.CONTEXT_LENGTH), Verdict.PASS),
        (Exchange(status=400, rejection=Rejection.OTHER), Verdict.WRONG_REJECTION),
        (Exchange(status=500, rejection=Rejection.OTHER), Verdict.WRONG_REJECTION),
        (_ok(), Verdict.PASS),
        (_ok(answer="I could not find a code in the text."), Verdict.MARKER_MISSING),
        (_ok(prompt_tokens=1, answer="nothing"), Verdict.TRUNCATED),
        (_ok(streamed=True, stream_error_frame=True), Verdict.STREAM_ERROR),
        (Exchange(status=401), Verdict.AUTH_ERROR),
        (Exchange(status=429), Verdict.THROTTLED),
        (Exchange(transport_error=TransportError.TIMEOUT), Verdict.ERROR),
    ],
)
def test_it_judges_each_edge_outcome(exchange: Exchange, verdict: Verdict) -> None:
    """Each way an engine can answer a prompt just over its pool has exactly one verdict."""
    assert judge_edge(PLAN, exchange).verdict is verdict


def test_the_edge_prompt_sits_one_token_over_the_pool() -> None:
    """SGLang's incident numbers: 681,281 tokens, inside the 1M window."""
    size = edge_prompt_tokens(
        rule=AcceptanceRule.PROMPT_PLUS_MAX_TOKENS, window=1_048_576, pool=681_280, max_tokens=16
    )
    assert size == 681_281


def test_there_is_no_edge_when_the_pool_covers_the_window() -> None:
    """A correctly sized engine has no gap; the over probe already covers its limit."""
    with pytest.raises(SizingError, match="no gap"):
        edge_prompt_tokens(
            rule=AcceptanceRule.PROMPT_PLUS_MAX_TOKENS, window=8192, pool=8192, max_tokens=16
        )
