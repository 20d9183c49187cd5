"""Verdict colours follow DESIGN §2 severities; the worst tone wins."""

from __future__ import annotations

import pytest

from kvwatch.canary.model import SEVERITY, Severity, Verdict
from kvwatch.web.tones import tone, worst

EXPECTED = {
    "pass": "ok",
    "marker_missing": "critical",
    "foreign_marker": "critical",
    "cross_tenant_leak": "critical",
    "over_accepted": "critical",
    "over_truncated": "info",
    "truncated": "critical",
    "capacity_mismatch": "critical",
    "under_rejected": "warning",
    "wrong_rejection": "warning",
    "stream_error": "warning",
    "canary_ineffective": "warning",
    "error": "error",
    "auth_error": "error",
    "throttled": "muted",
    "sizing_miss": "muted",
    "burst_leak": "critical",
    "burst_wrong": "critical",
    "cache_corrupt": "critical",
    "cache_not_exercised": "info",
}


@pytest.mark.parametrize("verdict", list(Verdict))
def test_every_verdict_has_its_colour(verdict: Verdict) -> None:
    """Critical verdicts are red, warnings amber, error grey-amber, throttled and sizing_miss
    grey, pass green, and an engine's documented truncation (over_truncated) blue."""
    assert tone(verdict.value) == EXPECTED[verdict.value]
    if SEVERITY[verdict] is Severity.CRITICAL:
        assert tone(verdict.value) == "critical"


def test_probes_without_a_verdict_are_pending_and_unknown_verdicts_stand_out() -> None:
    """Running/interrupted probes are grey-blue; a verdict unknown to kvwatch is 'unknown'."""
    assert tone(None, "running") == "pending"
    assert tone(None, "interrupted") == "pending"
    assert tone("leaked_twice") == "unknown"


def test_the_worst_tone_wins() -> None:
    """An endpoint with one critical probe among passes is critical; none at all is 'none'."""
    assert worst(["ok", "critical", "warning"]) == "critical"
    assert worst(["ok", "muted"]) == "muted"
    assert worst(["ok", "error", "warning"]) == "warning"
    assert worst([]) == "none"
