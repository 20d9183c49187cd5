"""With one marker per depth, a probe passes only on recalling all, and says what was lost."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from kvwatch.canary.edge import judge_edge
from kvwatch.canary.model import (
    DepthOutcome,
    Exchange,
    ForeignMarker,
    Message,
    Placement,
    PlannedPrompt,
    ProbeKind,
    Verdict,
)
from kvwatch.canary.verdicts import judge

HEAD, MID, TAIL = "KVW-1111-1111-1111", "KVW-2222-2222-2222", "KVW-3333-3333-3333"
PLACED = (Placement(0.0, HEAD), Placement(0.5, MID), Placement(1.0, TAIL))
LEAK = ForeignMarker("KVW-9999-9999-9999", 41, "glm-prod", datetime(2026, 12, 1, tzinfo=UTC))


def plan(kind: ProbeKind = ProbeKind.UNDER, planned: int = 8000) -> PlannedPrompt:
    return PlannedPrompt(
        kind=kind,
        messages=(Message("user", "…"),),
        marker=HEAD,
        planned_tokens=planned,
        target_tokens=planned,
        exact=True,
        tolerance=0,
        max_tokens=48,
        placements=PLACED,
    )


def answered(answer: str, prompt_tokens: int = 8000) -> Exchange:
    return Exchange(
        status=200,
        answer=answer,
        body_parsed=True,
        prompt_tokens=prompt_tokens,
        completion_tokens=40,
        streamed=True,
        stream_terminated=True,
        finish_reason="stop",
    )


def test_every_marker_recalled_passes_with_every_depth_found():
    """The pass rule: all codes back, usage as planned."""
    j = judge(plan(), answered(f"{HEAD} {MID} {TAIL}"))
    assert j.verdict is Verdict.PASS and j.marker_found
    assert [d.outcome for d in j.depths] == [DepthOutcome.FOUND] * 3


def test_a_partial_recall_with_full_usage_is_marker_missing_naming_the_lost_head():
    """Usage as planned but the first code is gone: marker_missing, and the reason localises."""
    j = judge(plan(), answered(f"{MID} {TAIL}"))
    assert j.verdict is Verdict.MARKER_MISSING and not j.marker_found
    assert j.reason == (
        "200 but the answer lacks 1 of 3 markers: head lost (markers at 0.0 missing; "
        "0.5, 1.0 found): the engine kept the last ~4,000–8,000 tokens"
    )


def test_a_truncated_tail_keeps_its_verdict_and_says_how_much_was_kept():
    """Usage shows the cut; the reason adds which end, with usage's figure."""
    j = judge(plan(), answered(f"{HEAD} {MID}", prompt_tokens=6144))
    assert j.verdict is Verdict.TRUNCATED
    assert j.reason == (
        "engine read 6144 of 8000 prompt tokens: tail lost (markers at 1.0 missing; "
        "0.0, 0.5 found): the engine kept the first ~6,144 tokens"
    )


def test_a_leak_marks_the_lost_depths_foreign_and_keeps_the_leak_verdict():
    """Another probe's marker in place of ours: foreign_marker, depths say foreign."""
    j = judge(plan(), answered(f"{LEAK.marker} {TAIL}"), [LEAK])
    assert j.verdict is Verdict.FOREIGN_MARKER
    assert [d.outcome for d in j.depths] == [
        DepthOutcome.FOREIGN,
        DepthOutcome.FOREIGN,
        DepthOutcome.FOUND,
    ]
    assert j.reason.endswith(
        "; head lost (markers at 0.0, 0.5 foreign; 1.0 found): "
        "the engine kept the last ~0–4,000 tokens"
    )


def test_a_baseline_that_misses_a_code_is_canary_ineffective_not_an_incident():
    """The short prompt carries the same depths; a weak recall there is a canary problem."""
    j = judge(plan(ProbeKind.BASELINE, planned=1536), answered(HEAD, prompt_tokens=1536))
    assert j.verdict is Verdict.CANARY_INEFFECTIVE
    assert j.reason.startswith("not every marker recalled even from a short prompt: tail lost")


def test_an_edge_probe_is_judged_on_every_marker_too():
    """The edge probe reuses the recall rules, so one lost code fails it."""
    j = judge_edge(plan(ProbeKind.EDGE), answered(f"{HEAD} {TAIL}"))
    assert j.verdict is Verdict.MARKER_MISSING
    assert "middle lost (markers at 0.5 missing; 0.0, 1.0 found)" in j.reason


@pytest.mark.parametrize("answer", ["KVW-1111-1111-1111", "I could not find a code."])
def test_a_single_marker_plan_keeps_todays_reasons_and_no_depths(answer):
    """Without placements nothing changes: one marker, the old reason, no per-depth list."""
    single = PlannedPrompt(
        kind=ProbeKind.UNDER,
        messages=(Message("user", "…"),),
        marker=HEAD,
        planned_tokens=8000,
        target_tokens=8000,
        exact=True,
        tolerance=0,
        max_tokens=32,
    )
    j = judge(single, answered(answer))
    assert j.depths == []
    assert j.reason in ("marker recalled", "200 but the answer lacks the marker")
