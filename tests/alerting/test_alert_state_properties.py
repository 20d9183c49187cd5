"""Properties of the alert state machine over arbitrary verdict sequences."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kvwatch.alerting.policy import CROSS_REQUEST_LEAK, default_policy
from kvwatch.canary.model import SEVERITY, Severity, Verdict
from tests.alerting.alert_scenarios import Scenario, Step

PROBES = ("under", "over", "baseline", "burst")
CRITICAL = sorted(v for v, s in SEVERITY.items() if s is Severity.CRITICAL)

steps = st.builds(
    Step,
    verdict=st.sampled_from(list(Verdict)),
    probe=st.sampled_from(PROBES),
    confirmation=st.booleans(),
    confirm_enabled=st.booleans(),
    endpoint=st.sampled_from(("a", "b")),
)
passes = st.builds(
    Step,
    verdict=st.just(Verdict.PASS),
    probe=st.sampled_from(PROBES),
    confirmation=st.booleans(),
    endpoint=st.sampled_from(("a", "b")),
)


@given(st.lists(passes, max_size=30))
def test_a_run_of_passes_never_raises_anything(run: list[Step]) -> None:
    """Passes alone leave no state at all, let alone a firing one."""
    scenario = Scenario()
    scenario.feed(*run)
    assert scenario.states == {}


@given(st.lists(steps, max_size=40), st.lists(passes, max_size=20))
def test_passes_after_any_history_never_fire_anything_new(
    history: list[Step], run: list[Step]
) -> None:
    """Once only passes arrive, no alert moves into firing."""
    scenario = Scenario()
    scenario.feed(*history)
    firing_before = {k for k, v in scenario.states.items() if v.state.value == "firing"}
    seen = len(scenario.history)
    scenario.feed(*run)
    for changes in scenario.history[seen:]:
        for state in changes:
            assert state.state.value != "firing" or state.key in firing_before


@given(st.lists(steps, max_size=60))
def test_firing_never_goes_back_to_pending_or_inactive_without_resolving(
    history: list[Step],
) -> None:
    """The only way out of firing is resolved: a page is always closed explicitly."""
    scenario = Scenario()
    scenario.feed(*history)
    for before, after in scenario.transitions():
        if before == "firing":
            assert after in ("firing", "resolved")


@given(st.lists(steps, max_size=40), st.sampled_from(CRITICAL), st.sampled_from(PROBES))
def test_a_confirmed_critical_failure_fires_unless_the_weak_baseline_explains_it(
    history: list[Step], verdict: Verdict, probe: str
) -> None:
    """After any history, a critical verdict and its failing confirmation fire the alert,
    except a suppressible boundary alert (never a leak) while the endpoint's baseline is failing."""
    scenario = Scenario()
    scenario.feed(*history)
    baseline_failing = any(
        state.state.value in ("pending", "firing")
        for key, state in scenario.states.items()
        if key.alertname == "KVWatchCanaryIneffective"
        and key.endpoint == "a"
        and key.probe == "baseline"  # a burst's own canary holds nothing back
    )
    alert = default_policy().alert_for(verdict)
    assert alert is not None
    before = scenario.state(alert.alertname, probe, "a")
    scenario.feed(
        Step(verdict, probe=probe, endpoint="a"),
        Step(verdict, probe=probe, endpoint="a", confirmation=True),
    )
    held = baseline_failing and probe in ("under", "over") and alert.suppressed_by_canary
    assert alert.alertname != CROSS_REQUEST_LEAK or not alert.suppressed_by_canary
    expected = "pending" if held and before != "firing" else "firing"
    assert scenario.state(alert.alertname, probe, "a") == expected


@given(st.lists(steps, max_size=40))
def test_throttled_never_changes_any_state(history: list[Step]) -> None:
    """A 429 at any point is invisible to the alerts."""
    scenario = Scenario()
    scenario.feed(*history)
    for probe in PROBES:
        for endpoint in ("a", "b"):
            assert scenario.feed(Step(Verdict.THROTTLED, probe=probe, endpoint=endpoint)) == []


@given(st.lists(steps, max_size=60))
def test_labels_and_starts_at_hold_still_while_an_alert_fires(history: list[Step]) -> None:
    """From firing to resolved, an alert's identity (labels) and startsAt never change."""
    scenario = Scenario()
    scenario.feed(*history)
    fired: dict[object, tuple[object, object]] = {}
    for changes in scenario.history:
        for state in changes:
            if state.key in fired:
                assert (state.labels, state.starts_at) == fired[state.key]
            if state.state.value == "firing":
                fired.setdefault(state.key, (state.labels, state.starts_at))
            else:
                fired.pop(state.key, None)
