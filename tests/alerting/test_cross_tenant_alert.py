"""KVWatchCrossTenantLeak: one alert per endpoint and probe kind, labelled with both tenants."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kvwatch.alerting.policy import CROSS_REQUEST_LEAK, CROSS_TENANT_LEAK, default_policy
from kvwatch.alerting.state import (
    AlertKey,
    AlertState,
    AlertStatus,
    Evidence,
    ProbeEvent,
    describe,
    evaluate,
)
from kvwatch.canary.model import ForeignMarker, Severity, Verdict

T0 = datetime(2026, 12, 3, 5, 0, tzinfo=UTC)
KEY = AlertKey(CROSS_TENANT_LEAK, "glm-prod", "under")


def leak_event(
    probe_id: int,
    *,
    tenant: str = "globex",
    source: str = "acme",
    confirmation: bool = False,
    verdict: Verdict = Verdict.CROSS_TENANT_LEAK,
) -> ProbeEvent:
    foreign = ForeignMarker("KVW-AAAA-BBBB-CCCC", 40, "glm-prod", T0, tenant=source)
    return ProbeEvent(
        endpoint="glm-prod",
        model="glm-5.3",
        probe="under",
        verdict=verdict,
        probe_id=probe_id,
        confirmation=confirmation,
        evidence=Evidence(reason="leak", status=200, marker_found=False, foreign=(foreign,)),
        generator_url=f"http://kvwatch.test/probes/{probe_id}",
        labels={"team": "inference"},
        tenant=tenant,
    )


def run(*events: ProbeEvent) -> dict[AlertKey, AlertState]:
    states: dict[AlertKey, AlertState] = {}
    now = T0
    for event in events:
        now += timedelta(minutes=1)
        for state in evaluate(states, event, default_policy(), now):
            states[state.key] = state
    return states


def test_a_confirmed_cross_tenant_leak_fires_with_both_tenants_in_its_labels() -> None:
    """Labels: endpoint, probe, source_tenant (whose marker) and tenant (who was served)."""
    states = run(leak_event(41), leak_event(42, confirmation=True))
    alert = states[KEY]
    assert alert.state is AlertStatus.FIRING
    assert alert.severity == Severity.CRITICAL.value
    assert alert.labels == {
        "alertname": "KVWatchCrossTenantLeak",
        "severity": "critical",
        "endpoint": "glm-prod",
        "model": "glm-5.3",
        "probe": "under",
        "team": "inference",
        "source_tenant": "acme",
        "tenant": "globex",
    }
    assert alert.annotations["summary"] == (
        "glm-prod answered tenant globex's under canary with tenant acme's data"
    )
    assert alert.annotations["runbook_url"].endswith("#kvwatchcrosstenantleak")


def test_another_tenant_pair_while_firing_keeps_one_alert_and_its_labels() -> None:
    """The fault is the engine's: a second pair updates the description, not the identity."""
    states = run(
        leak_event(41),
        leak_event(42, confirmation=True),
        leak_event(43, tenant="acme", source="initech"),
    )
    assert [k for k in states if k.alertname == CROSS_TENANT_LEAK] == [KEY]
    alert = states[KEY]
    assert (alert.labels["source_tenant"], alert.labels["tenant"]) == ("acme", "globex")
    assert "under tenant acme" in alert.annotations["description"]
    assert "under tenant initech" in alert.annotations["description"]


def test_it_resolves_after_two_passes_under_any_tenant() -> None:
    """Recovery is the endpoint's: clean answers under other tenants count."""
    pass_acme = leak_event(44, tenant="acme", verdict=Verdict.PASS)
    pass_globex = leak_event(45, tenant="globex", verdict=Verdict.PASS)
    states = run(leak_event(41), leak_event(42, confirmation=True), pass_acme, pass_globex)
    assert states[KEY].state is AlertStatus.RESOLVED


def test_a_same_tenant_leak_raises_the_cross_request_alert_only() -> None:
    """foreign_marker stays KVWatchCrossRequestLeak, without tenant labels."""
    same = leak_event(41, source="globex", verdict=Verdict.FOREIGN_MARKER)
    states = run(
        same, leak_event(42, source="globex", verdict=Verdict.FOREIGN_MARKER, confirmation=True)
    )
    assert KEY not in states
    alert = states[AlertKey(CROSS_REQUEST_LEAK, "glm-prod", "under")]
    assert alert.state is AlertStatus.FIRING
    assert "tenant" not in alert.labels and "source_tenant" not in alert.labels


def test_the_description_names_the_tenant_served_and_the_source_probe() -> None:
    """The page says who got whose data, from which probe, when."""
    text = describe(leak_event(41))
    assert "The under probe 41 of glm-prod (glm-5.3) under tenant globex ended in verdict" in text
    assert "marker of probe 40, issued to glm-prod under tenant acme at 2026-12-03T05:00:00" in text
