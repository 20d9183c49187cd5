"""An endpoint no longer probed: its firing alerts resolve saying why, its pending ones go."""

from __future__ import annotations

from datetime import UTC, datetime

from kvwatch.alerting.evaluator import RESOLVED_REASON, AlertEvaluator
from kvwatch.alerting.policy import default_policy
from kvwatch.store.records import AlertStateRecord

EARLIER = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)
NOW = datetime(2026, 12, 4, 11, 0, tzinfo=UTC)


def state(endpoint: str, probe: str, status: str) -> AlertStateRecord:
    return AlertStateRecord(
        alertname="KVWatchContextNotHonored",
        endpoint=endpoint,
        probe=probe,
        state=status,
        severity="critical",
        updated_at=EARLIER,
        failures=2,
        starts_at=EARLIER,
        annotations={"summary": "the window is not honoured"},
    )


def test_retiring_resolves_firing_alerts_with_the_reason_and_clears_pending_ones() -> None:
    """Firing: resolved now, with resolved_reason beside the old annotations. Pending:
    inactive. Other endpoints: untouched."""
    evaluator = AlertEvaluator(
        policy=default_policy(),
        states=[
            state("gone", "under", "firing"),
            state("gone", "over", "pending"),
            state("kept", "under", "firing"),
        ],
        probe_url=lambda probe_id: f"http://kvwatch/probes/{probe_id}",
        clock=lambda: NOW,
    )
    reason = "discovery source fleet no longer lists the endpoint"
    firing, pending = evaluator.retire("gone", reason)

    assert (firing.probe, firing.state, firing.ends_at) == ("under", "resolved", NOW)
    assert firing.annotations == {"summary": "the window is not honoured", RESOLVED_REASON: reason}
    assert (pending.probe, pending.state, pending.failures) == ("over", "inactive", 0)
    assert RESOLVED_REASON not in pending.annotations
