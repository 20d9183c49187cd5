"""Shared scaffolding for the state-machine tests: feed verdicts in, read states out."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from kvwatch.alerting.policy import AlertingPolicy, default_policy
from kvwatch.alerting.state import AlertKey, AlertState, Evidence, ProbeEvent, evaluate
from kvwatch.canary.model import Verdict

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Step:
    verdict: Verdict
    probe: str = "under"
    confirmation: bool = False
    confirm_enabled: bool = True
    endpoint: str = "glm-prod"
    model: str = "glm-5.3"


def event(step: Step, probe_id: int) -> ProbeEvent:
    return ProbeEvent(
        endpoint=step.endpoint,
        model=step.model,
        probe=step.probe,
        verdict=step.verdict,
        probe_id=probe_id,
        confirmation=step.confirmation,
        confirm_enabled=step.confirm_enabled,
        evidence=Evidence(reason="test", planned_tokens=4080, reported_tokens=4080, status=200),
        generator_url=f"http://kvwatch.test/probes/{probe_id}",
    )


class Scenario:
    """Applies steps one minute apart and keeps every state and every change seen."""

    def __init__(
        self, policy: AlertingPolicy | None = None, states: Mapping[AlertKey, AlertState] = {}
    ) -> None:
        self.policy = policy or default_policy()
        self.states: dict[AlertKey, AlertState] = dict(states)
        self.history: list[list[AlertState]] = []
        self.now = T0
        self.probe_id = 0

    def feed(self, *steps: Step) -> list[AlertState]:
        """Apply ``steps``; return the changes made by the last one."""
        changes: list[AlertState] = []
        for step in steps:
            self.now += timedelta(minutes=1)
            self.probe_id += 1
            changes = evaluate(self.states, event(step, self.probe_id), self.policy, self.now)
            for state in changes:
                self.states[state.key] = state
            self.history.append(changes)
        return changes

    def state(self, alertname: str, probe: str = "under", endpoint: str = "glm-prod") -> str:
        found = self.states.get(AlertKey(alertname, endpoint, probe))
        return "absent" if found is None else found.state.value

    def get(self, alertname: str, probe: str = "under", endpoint: str = "glm-prod") -> AlertState:
        return self.states[AlertKey(alertname, endpoint, probe)]

    def transitions(self) -> Iterable[tuple[str, str]]:
        """Every (before, after) status pair seen, per key, in order."""
        last: dict[AlertKey, str] = {}
        for changes in self.history:
            for state in changes:
                before = last.get(state.key, "inactive")
                yield before, state.state.value
                last[state.key] = state.state.value
