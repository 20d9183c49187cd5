"""Every transition of the alert state machine, one verdict sequence at a time."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from kvwatch.alerting.policy import (
    CANARY_INEFFECTIVE,
    CAPACITY_MISMATCH,
    CONTEXT_NOT_HONORED,
    CROSS_REQUEST_LEAK,
    LIMIT_NOT_ENFORCED,
    PROBE_FAILING,
    WINDOW_NOT_SERVED,
    WRONG_REJECTION,
    default_policy,
)
from kvwatch.alerting.state import AlertKey, AlertState, AlertStatus, ProbeEvent, evaluate
from kvwatch.canary.model import Verdict as V
from tests.alerting.alert_scenarios import T0, Scenario, Step

PASS = Step(V.PASS)
MISSING = Step(V.MARKER_MISSING)
MISSING_CONFIRMED = Step(V.MARKER_MISSING, confirmation=True)
PASS_CONFIRMATION = Step(V.PASS, confirmation=True)
REJECTED = Step(V.UNDER_REJECTED)
BASELINE_WEAK = Step(V.CANARY_INEFFECTIVE, probe="baseline")
BASELINE_PASS = Step(V.PASS, probe="baseline")
ERROR = Step(V.ERROR)
LEAK = Step(V.FOREIGN_MARKER)
LEAK_CONFIRMED = Step(V.FOREIGN_MARKER, confirmation=True)
OVER_UNCONFIRMABLE = Step(V.OVER_ACCEPTED, probe="over", confirm_enabled=False)
TRUNCATED = Step(V.TRUNCATED)
OVER_CUT = Step(V.OVER_TRUNCATED, probe="over")
TRUNCATED_CONFIRMED = Step(V.TRUNCATED, confirmation=True)
CNH = CONTEXT_NOT_HONORED

# (steps, alert, probe, final status): each row one path through the machine.
TABLE = [
    ([MISSING], CONTEXT_NOT_HONORED, "under", "pending"),
    ([MISSING, MISSING_CONFIRMED], CONTEXT_NOT_HONORED, "under", "firing"),
    ([MISSING, PASS_CONFIRMATION], CONTEXT_NOT_HONORED, "under", "inactive"),
    ([Step(V.MARKER_MISSING, confirm_enabled=False)], CONTEXT_NOT_HONORED, "under", "firing"),
    ([MISSING, MISSING], CONTEXT_NOT_HONORED, "under", "firing"),
    ([MISSING, Step(V.THROTTLED, confirmation=True)], CONTEXT_NOT_HONORED, "under", "pending"),
    ([MISSING, MISSING_CONFIRMED, PASS], CONTEXT_NOT_HONORED, "under", "firing"),
    ([MISSING, MISSING_CONFIRMED, PASS, PASS], CONTEXT_NOT_HONORED, "under", "resolved"),
    ([MISSING, MISSING_CONFIRMED, PASS, ERROR, PASS], CNH, "under", "firing"),
    ([MISSING, MISSING_CONFIRMED, PASS, PASS, MISSING], CONTEXT_NOT_HONORED, "under", "pending"),
    ([TRUNCATED, TRUNCATED_CONFIRMED], CNH, "under", "firing"),
    ([REJECTED], WINDOW_NOT_SERVED, "under", "pending"),
    ([REJECTED, REJECTED], WINDOW_NOT_SERVED, "under", "pending"),
    ([REJECTED, REJECTED, REJECTED], WINDOW_NOT_SERVED, "under", "firing"),
    ([REJECTED, REJECTED, PASS, REJECTED], WINDOW_NOT_SERVED, "under", "pending"),
    ([REJECTED, REJECTED, Step(V.ERROR), REJECTED], WINDOW_NOT_SERVED, "under", "firing"),
    ([REJECTED, REJECTED, REJECTED, PASS], WINDOW_NOT_SERVED, "under", "resolved"),
    ([Step(V.ERROR)] * 3, PROBE_FAILING, "under", "firing"),
    ([Step(V.AUTH_ERROR)] * 3, PROBE_FAILING, "under", "firing"),
    ([Step(V.ERROR)] * 3 + [MISSING], PROBE_FAILING, "under", "resolved"),
    ([Step(V.ERROR)] * 3 + [Step(V.THROTTLED)], PROBE_FAILING, "under", "firing"),
    ([Step(V.STREAM_ERROR)] * 3, WRONG_REJECTION, "under", "firing"),
    ([Step(V.WRONG_REJECTION, probe="over")] * 3, WRONG_REJECTION, "over", "firing"),
    ([Step(V.OVER_ACCEPTED, probe="over")] * 2, LIMIT_NOT_ENFORCED, "over", "firing"),
    # Ollama's documented cut (issue 13): never raises, and resolves an over_accepted page.
    ([OVER_CUT] * 3, LIMIT_NOT_ENFORCED, "over", "inactive"),
    ([Step(V.OVER_ACCEPTED, probe="over")] * 2 + [OVER_CUT], LIMIT_NOT_ENFORCED, "over", "firing"),
    (
        [Step(V.OVER_ACCEPTED, probe="over")] * 2 + [OVER_CUT] * 2,
        LIMIT_NOT_ENFORCED,
        "over",
        "resolved",
    ),
    ([LEAK, LEAK_CONFIRMED], CROSS_REQUEST_LEAK, "under", "firing"),
    ([Step(V.CAPACITY_MISMATCH, probe="", confirm_enabled=False)], CAPACITY_MISMATCH, "", "firing"),
    ([BASELINE_WEAK] * 3, CANARY_INEFFECTIVE, "baseline", "firing"),
    ([BASELINE_WEAK] * 3 + [BASELINE_PASS], CANARY_INEFFECTIVE, "baseline", "resolved"),
    # While the baseline fails, a confirmed boundary failure stays pending...
    ([BASELINE_WEAK, MISSING, MISSING_CONFIRMED], CONTEXT_NOT_HONORED, "under", "pending"),
    ([BASELINE_WEAK, OVER_UNCONFIRMABLE], LIMIT_NOT_ENFORCED, "over", "pending"),
    ([BASELINE_WEAK, REJECTED, REJECTED, REJECTED], WINDOW_NOT_SERVED, "under", "pending"),
    # ...and fires on the next failure once the baseline recovers.
    ([BASELINE_WEAK, MISSING, MISSING_CONFIRMED, BASELINE_PASS, MISSING], CNH, "under", "firing"),
    # A leak is proof regardless of recall ability; an error streak is not about recall.
    ([BASELINE_WEAK, LEAK, LEAK_CONFIRMED], CROSS_REQUEST_LEAK, "under", "firing"),
    ([BASELINE_WEAK] + [Step(V.ERROR)] * 3, PROBE_FAILING, "under", "firing"),
    # A burst whose solo request cannot do its two-fact task is its own canary's problem:
    # it warns (probe=burst) but never holds back the boundary alerts, as the baseline does.
    ([Step(V.CANARY_INEFFECTIVE, probe="burst")] * 3, CANARY_INEFFECTIVE, "burst", "firing"),
    (
        [Step(V.CANARY_INEFFECTIVE, probe="burst"), MISSING, MISSING_CONFIRMED],
        CONTEXT_NOT_HONORED,
        "under",
        "firing",
    ),
    # An alert already firing is not taken back by a baseline that starts failing later.
    ([MISSING, MISSING_CONFIRMED, BASELINE_WEAK, MISSING], CONTEXT_NOT_HONORED, "under", "firing"),
]


@pytest.mark.parametrize(("steps", "alert", "probe", "expected"), TABLE)
def test_each_verdict_sequence_ends_in_its_tabled_state(
    steps: list[Step], alert: str, probe: str, expected: str
) -> None:
    """Each tabled sequence of verdicts leaves the alert in the tabled state."""
    scenario = Scenario()
    scenario.feed(*steps)
    final = scenario.state(alert, probe)
    assert (final if final != "absent" else "inactive") == expected


def test_it_fires_with_starts_at_of_the_confirmation_and_keeps_it_while_firing() -> None:
    """startsAt is the time the failure was confirmed and does not move while firing."""
    scenario = Scenario()
    scenario.feed(MISSING, MISSING_CONFIRMED)
    fired = scenario.get(CONTEXT_NOT_HONORED)
    assert fired.starts_at == T0 + timedelta(minutes=2)
    scenario.feed(MISSING, MISSING, PASS)
    assert scenario.get(CONTEXT_NOT_HONORED).starts_at == fired.starts_at


def test_it_sets_ends_at_to_the_resolution_time() -> None:
    """A resolved alert carries the time of the recovery that resolved it."""
    scenario = Scenario()
    scenario.feed(REJECTED, REJECTED, REJECTED, PASS)
    resolved = scenario.get(WINDOW_NOT_SERVED)
    assert resolved.ends_at == T0 + timedelta(minutes=4)
    assert resolved.starts_at == T0 + timedelta(minutes=3)


def test_a_new_failure_after_resolution_starts_a_fresh_cycle() -> None:
    """Pending again after resolved: no startsAt or endsAt left over from the last page."""
    scenario = Scenario()
    scenario.feed(REJECTED, REJECTED, REJECTED, PASS, REJECTED)
    again = scenario.get(WINDOW_NOT_SERVED)
    assert (again.state, again.starts_at, again.ends_at, again.failures) == (
        AlertStatus.PENDING,
        None,
        None,
        1,
    )


def test_throttled_changes_nothing() -> None:
    """A 429 is neither a failure nor a pass, whatever state the alerts are in."""
    scenario = Scenario()
    scenario.feed(MISSING, MISSING_CONFIRMED, PASS)
    assert scenario.feed(Step(V.THROTTLED)) == []
    assert scenario.feed(Step(V.THROTTLED, confirmation=True)) == []


def test_a_pass_with_no_alert_on_record_creates_no_state() -> None:
    """A healthy probe writes nothing: the outbox only holds alerts that were raised."""
    scenario = Scenario()
    assert scenario.feed(PASS, PASS, BASELINE_PASS) == []
    assert scenario.states == {}


def test_a_pass_touches_only_alerts_of_the_same_probe_kind() -> None:
    """Recovery of an under probe says nothing about the over limit."""
    scenario = Scenario()
    over = Step(V.OVER_ACCEPTED, probe="over")
    scenario.feed(over, over)
    assert scenario.feed(PASS, PASS) == []
    assert scenario.state(LIMIT_NOT_ENFORCED, "over") == "firing"


def test_a_capacity_pass_recovers_the_edge_probes_alerts_and_nothing_else() -> None:
    """The pool now holds the window, so no edge probe will run: capacity passes resolve the
    edge's alert as edge passes would (two for a critical one); a mismatch, or a capacity
    pass of another endpoint, does not; an under alert is untouched."""
    scenario = Scenario()
    edge_missing = Step(V.MARKER_MISSING, probe="edge")
    scenario.feed(
        edge_missing, replace(edge_missing, confirmation=True), MISSING, MISSING_CONFIRMED
    )
    assert scenario.state(CONTEXT_NOT_HONORED, "edge") == "firing"
    scenario.feed(Step(V.CAPACITY_MISMATCH, probe="capacity"))
    scenario.feed(Step(V.PASS, probe="capacity", endpoint="other"))
    assert scenario.get(CONTEXT_NOT_HONORED, "edge").passes == 0
    scenario.feed(Step(V.PASS, probe="capacity"))
    assert scenario.state(CONTEXT_NOT_HONORED, "edge") == "firing"
    scenario.feed(Step(V.PASS, probe="capacity"))
    assert scenario.state(CONTEXT_NOT_HONORED, "edge") == "resolved"
    assert scenario.state(CONTEXT_NOT_HONORED) == "firing"


def test_a_pass_touches_only_alerts_of_the_same_endpoint() -> None:
    """One endpoint's recovery does not resolve another endpoint's alert."""
    scenario = Scenario()
    scenario.feed(MISSING, MISSING_CONFIRMED)
    scenario.feed(Step(V.PASS, endpoint="other"), Step(V.PASS, endpoint="other"))
    assert scenario.state(CONTEXT_NOT_HONORED) == "firing"


def test_another_failure_breaks_the_recovery_streak() -> None:
    """Passes count consecutively: an error between two passes starts the count again."""
    scenario = Scenario()
    scenario.feed(MISSING, MISSING_CONFIRMED, PASS, Step(V.ERROR))
    assert scenario.get(CONTEXT_NOT_HONORED).passes == 0


def test_labels_are_the_stable_set_with_static_labels_beneath_them() -> None:
    """Labels: alertname, severity, endpoint, model, probe over endpoint and global labels."""
    policy = default_policy(static_labels={"team": "platform", "env": "prod"})
    scenario = Scenario(policy)
    steps = [Step(V.MARKER_MISSING, confirm_enabled=False)]
    changes = scenario.feed(*steps)
    assert changes[0].labels == {
        "alertname": CONTEXT_NOT_HONORED,
        "severity": "critical",
        "endpoint": "glm-prod",
        "model": "glm-5.3",
        "probe": "under",
        "team": "platform",
        "env": "prod",
    }


def test_labels_do_not_change_while_firing_even_if_the_model_does() -> None:
    """A firing alert keeps the labels it fired with: they are its identity."""
    scenario = Scenario()
    scenario.feed(Step(V.MARKER_MISSING, confirm_enabled=False))
    scenario.feed(Step(V.MARKER_MISSING, model="glm-5.4"))
    assert scenario.get(CONTEXT_NOT_HONORED).labels["model"] == "glm-5.3"


def test_annotations_carry_summary_evidence_and_runbook() -> None:
    """summary, description with the evidence, and a runbook link anchored on the alert."""
    scenario = Scenario(default_policy(runbook_base="https://wiki.example/runbooks"))
    scenario.feed(MISSING, MISSING_CONFIRMED)
    fired = scenario.get(CONTEXT_NOT_HONORED)
    assert (
        fired.annotations["runbook_url"] == "https://wiki.example/runbooks#kvwatchcontextnothonored"
    )
    assert fired.annotations["summary"] == (
        "glm-prod accepted the under canary but did not attend to all of it"
    )
    assert fired.annotations["description"] == (
        "The under probe 2 (a confirmation re-check) of glm-prod (glm-5.3) ended in verdict "
        "marker_missing: test. Planned 4080 prompt tokens; the engine reported 4080. "
        "HTTP status 200."
    )
    assert fired.generator_url == "http://kvwatch.test/probes/2"
    assert fired.last_probe_id == 2


def test_in_multi_region_mode_every_alert_carries_its_region_and_names_it() -> None:
    """A region adds a `region` label above every other label and a phrase to the description."""
    scenario = Scenario(default_policy(static_labels={"team": "platform"}, region="eu"))
    scenario.feed(MISSING, MISSING_CONFIRMED)
    fired = scenario.get(CONTEXT_NOT_HONORED)
    assert fired.labels == {
        "alertname": CONTEXT_NOT_HONORED,
        "severity": "critical",
        "endpoint": "glm-prod",
        "model": "glm-5.3",
        "probe": "under",
        "team": "platform",
        "region": "eu",
    }
    assert fired.annotations["description"] == (
        "The under probe 2 (a confirmation re-check) of glm-prod (glm-5.3) from region eu "
        "ended in verdict marker_missing: test. Planned 4080 prompt tokens; the engine "
        "reported 4080. HTTP status 200."
    )


def test_an_endpoint_label_named_region_cannot_shadow_the_region() -> None:
    """Even a `region` label that slipped past config validation loses to kvwatch's own."""
    policy = default_policy(region="eu")
    event = ProbeEvent(
        endpoint="glm-prod",
        model="glm-5.3",
        probe="over",
        verdict=V.OVER_ACCEPTED,
        confirm_enabled=False,
        labels={"region": "us", "team": "inference"},
    )
    [fired] = evaluate({}, event, policy, T0)
    assert (fired.labels["region"], fired.labels["team"]) == ("eu", "inference")


def test_without_a_region_no_alert_has_a_region_label() -> None:
    """Single-region mode: the labels are exactly the stable set, and the endpoint's own."""
    event = ProbeEvent(
        endpoint="glm-prod",
        model="glm-5.3",
        probe="over",
        verdict=V.OVER_ACCEPTED,
        confirm_enabled=False,
        labels={"region": "us"},
    )
    [fired] = evaluate({}, event, default_policy(), T0)
    assert fired.labels["region"] == "us"
    assert "region" not in evaluate({}, replace(event, labels={}), default_policy(), T0)[0].labels
    assert "region" not in fired.annotations["description"]


def test_severity_follows_the_alert_not_the_verdict() -> None:
    """Both verdicts of KVWatchProbeFailing page as warning; the label cannot flip."""
    scenario = Scenario()
    scenario.feed(Step(V.ERROR), Step(V.AUTH_ERROR))
    assert scenario.get(PROBE_FAILING).severity == "warning"


def test_overrides_change_when_an_alert_fires_and_resolves() -> None:
    """Per-alert fire_after and resolve_after come from the policy mapping."""
    policy = default_policy(overrides={WINDOW_NOT_SERVED: {"fire_after": 1, "resolve_after": 2}})
    scenario = Scenario(policy)
    scenario.feed(REJECTED)
    assert scenario.state(WINDOW_NOT_SERVED) == "firing"
    scenario.feed(PASS)
    assert scenario.state(WINDOW_NOT_SERVED) == "firing"
    scenario.feed(PASS)
    assert scenario.state(WINDOW_NOT_SERVED) == "resolved"


def test_a_state_left_by_an_alert_no_longer_in_the_policy_is_ignored() -> None:
    """Stored states of unknown alerts are left alone rather than crashing the runner."""
    key = AlertKey("KVWatchRetired", "glm-prod", "under")
    stale = AlertState(
        alertname=key.alertname,
        endpoint=key.endpoint,
        probe=key.probe,
        state=AlertStatus.FIRING,
        severity="warning",
        updated_at=T0,
    )
    scenario = Scenario(states={key: stale})
    assert scenario.feed(PASS) == []


def test_updated_at_is_the_evaluation_time() -> None:
    """Every changed state is stamped with the ``now`` it was evaluated at."""
    scenario = Scenario()
    changes = scenario.feed(MISSING)
    assert [c.updated_at for c in changes] == [scenario.now]


def test_a_state_row_with_a_plain_string_status_is_understood() -> None:
    """from_record and the constructor accept the plain string a database row holds."""
    row = AlertState(
        alertname=CONTEXT_NOT_HONORED,
        endpoint="glm-prod",
        probe="under",
        state="firing",  # type: ignore[arg-type]
        severity="critical",
        updated_at=T0,
        starts_at=T0,
    )
    restored = AlertState.from_record(row)
    assert restored.state is AlertStatus.FIRING
    scenario = Scenario(states={restored.key: restored})
    scenario.feed(PASS, PASS)
    assert scenario.state(CONTEXT_NOT_HONORED) == "resolved"
