"""An endpoint no longer probed: its firing alerts resolve saying why, its pending ones go."""

from __future__ import annotations

from datetime import UTC, datetime

from kvwatch.alerting.evaluator import KEEP_RETIRED, RESOLVED_REASON, AlertEvaluator
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


def test_retiring_probes_ends_only_their_alerts_and_keeps_the_endpoint() -> None:
    """Only the named kinds: firing resolved with the reason, pending inactive; the
    endpoint's other alerts stay, and its states are not forgotten as a removed one's are."""
    now = [NOW]
    evaluator = AlertEvaluator(
        policy=default_policy(),
        states=[
            state("ep", "over", "firing"),
            state("ep", "edge", "pending"),
            state("ep", "under", "firing"),
        ],
        probe_url=lambda probe_id: f"http://kvwatch/probes/{probe_id}",
        clock=lambda: now[0],
    )
    ended = evaluator.retire_probes("ep", {"over", "edge"}, "no longer run")
    assert sorted((r.probe, r.state) for r in ended) == [("edge", "inactive"), ("over", "resolved")]
    evaluator.committed(ended)
    now[0] = NOW + KEEP_RETIRED * 2
    assert [k.probe for k in evaluator.firing()] == ["under"]
    assert sorted(r.probe for r in evaluator.records()) == ["edge", "over", "under"]
    assert evaluator.held() == {"ep": {"edge", "over", "under"}}
