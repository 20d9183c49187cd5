"""The shipped alert policy and the exact errors of a policy that cannot work."""

from __future__ import annotations

import dataclasses

import pytest

from kvwatch.alerting.policy import (
    CONTEXT_NOT_HONORED,
    PROBE_FAILING,
    WINDOW_NOT_SERVED,
    AlertingPolicy,
    PolicyError,
    default_policy,
)
from kvwatch.canary.model import SEVERITY, Severity, Verdict


def test_every_failing_verdict_raises_exactly_one_alert() -> None:
    """Pass, over_truncated, throttled, sizing_miss and cache_not_exercised raise nothing;
    every other verdict raises one named alert."""
    policy = default_policy()
    for verdict in Verdict:
        alert = policy.alert_for(verdict)
        if verdict in (
            Verdict.PASS,
            Verdict.OVER_TRUNCATED,
            Verdict.THROTTLED,
            Verdict.SIZING_MISS,
            Verdict.CACHE_NOT_EXERCISED,
        ):
            assert alert is None
        else:
            assert alert is not None, verdict


def test_alert_severity_matches_the_verdict_severity_of_design() -> None:
    """An alert pages at the DESIGN §2 severity of the verdicts that raise it."""
    policy = default_policy()
    for verdict, severity in SEVERITY.items():
        alert = policy.alert_for(verdict)
        if alert is not None:
            assert alert.severity is severity, verdict


def test_the_runbook_url_is_anchored_on_the_lower_case_alert_name() -> None:
    """runbook_url = base + '#' + alertname.lower(), and a trailing '#' is not doubled."""
    policy = default_policy(runbook_base="https://runbooks.example/kvwatch.md#")
    assert policy.runbook_url(CONTEXT_NOT_HONORED) == (
        "https://runbooks.example/kvwatch.md#kvwatchcontextnothonored"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"overrides": {"KVWatchNope": {"fire_after": 2}}},
            "alerts.KVWatchNope: unknown alert (known: KVWatchBurstWrong, "
            "KVWatchCacheCorrupt, KVWatchCanaryIneffective, KVWatchCapacityMismatch, "
            "KVWatchContextNotHonored, KVWatchCrossRequestLeak, KVWatchCrossTenantLeak, "
            "KVWatchLimitNotEnforced, KVWatchProbeFailing, KVWatchWindowNotServed, "
            "KVWatchWrongRejection)",
        ),
        (
            {"overrides": {PROBE_FAILING: {"for": "5m"}}},
            "alerts.KVWatchProbeFailing.for: unknown key",
        ),
        (
            {"overrides": {PROBE_FAILING: {"fire_after": 0}}},
            "alerts.KVWatchProbeFailing.fire_after: must be a positive integer",
        ),
        (
            {"overrides": {PROBE_FAILING: {"fire_after": "3"}}},
            "alerts.KVWatchProbeFailing.fire_after: must be a positive integer",
        ),
        (
            {"overrides": {PROBE_FAILING: {"resolve_after": True}}},
            "alerts.KVWatchProbeFailing.resolve_after: must be a positive integer",
        ),
        (
            {"overrides": {PROBE_FAILING: {"severity": "page"}}},
            "alerts.KVWatchProbeFailing.severity: must be critical or warning",
        ),
        (
            # A verdict severity, but one that never pages: no alert may be sent with it.
            {"overrides": {PROBE_FAILING: {"severity": "info"}}},
            "alerts.KVWatchProbeFailing.severity: must be critical or warning",
        ),
        (
            {"overrides": {PROBE_FAILING: {"suppressed_by_canary": "yes"}}},
            "alerts.KVWatchProbeFailing.suppressed_by_canary: must be true or false",
        ),
        (
            {"static_labels": {"severity": "low"}},
            "labels.severity: is set by kvwatch and cannot be overridden",
        ),
        (
            {"static_labels": {"region": "us"}, "region": "eu"},
            "labels.region: is set by kvwatch and cannot be overridden",
        ),
        (
            {"static_labels": {"team-name": "x"}},
            "labels.team-name: is not a valid Prometheus label name",
        ),
    ],
)
def test_it_rejects_a_policy_that_cannot_work(kwargs: dict[str, object], message: str) -> None:
    """Each bad override or static label fails with its exact sentence."""
    with pytest.raises(PolicyError) as raised:
        default_policy(**kwargs)  # type: ignore[arg-type]
    assert str(raised.value) == message


def test_it_rejects_a_verdict_raising_two_alerts() -> None:
    """Two alerts claiming one verdict would page twice for one fault."""
    alerts = dict(default_policy().alerts)
    alerts[WINDOW_NOT_SERVED] = dataclasses.replace(
        alerts[WINDOW_NOT_SERVED], verdicts=frozenset({Verdict.UNDER_REJECTED, Verdict.TRUNCATED})
    )
    with pytest.raises(PolicyError) as raised:
        AlertingPolicy(alerts=alerts)
    assert "verdict truncated already raises" in str(raised.value)


def test_an_override_changes_only_the_named_alert() -> None:
    """Overrides are per alert; the other alerts keep their shipped numbers."""
    policy = default_policy(overrides={PROBE_FAILING: {"fire_after": 5, "severity": "critical"}})
    assert policy.alerts[PROBE_FAILING].fire_after == 5
    assert policy.alerts[PROBE_FAILING].severity is Severity.CRITICAL
    assert policy.alerts[CONTEXT_NOT_HONORED] == default_policy().alerts[CONTEXT_NOT_HONORED]


def test_an_engines_documented_truncation_raises_nothing_and_clears_every_alert() -> None:
    """over_truncated (Ollama's cut over prompt) is info: no alert, and a recovery for all
    of them, so a LimitNotEnforced page from before the fix resolves."""
    policy = default_policy()
    assert SEVERITY[Verdict.OVER_TRUNCATED] is Severity.INFO
    assert policy.alert_for(Verdict.OVER_TRUNCATED) is None
    for alert in policy.alerts.values():
        assert Verdict.OVER_TRUNCATED in alert.recovers_on, alert.alertname
