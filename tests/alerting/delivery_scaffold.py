"""Shared scaffolding for delivery tests: a movable clock, an outbox, firing states."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry

from kvwatch.alerting.alertmanager import AlertmanagerSettings
from kvwatch.alerting.delivery import Delivery
from kvwatch.alerting.state import AlertState, AlertStatus

FROZEN = datetime(2025, 3, 1, 12, 0, 0, 123000, tzinfo=UTC)


class Clock:
    """A clock the test moves by hand; starts at ``start`` (the real time when omitted)."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class Outbox:
    """The alert states delivery reads, as the store would return them."""

    def __init__(self, *states: AlertState) -> None:
        self.states = {s.key: s for s in states}

    def put(self, state: AlertState) -> None:
        self.states[state.key] = state

    async def load(self) -> Sequence[AlertState]:
        return list(self.states.values())


def firing(
    starts_at: datetime,
    alertname: str = "KVWatchContextNotHonored",
    endpoint: str = "glm-prod",
    probe: str = "under",
    **labels: str,
) -> AlertState:
    return AlertState(
        alertname=alertname,
        endpoint=endpoint,
        probe=probe,
        state=AlertStatus.FIRING,
        severity="critical",
        updated_at=starts_at,
        failures=2,
        starts_at=starts_at,
        last_probe_id=42,
        labels={
            "alertname": alertname,
            "severity": "critical",
            "endpoint": endpoint,
            "model": "glm-5.3",
            "probe": probe,
            **labels,
        },
        annotations={
            "summary": f"{endpoint} accepted the {probe} canary but did not attend to all of it",
            "description": "The under probe 42 ended in verdict marker_missing.",
            "runbook_url": "https://runbooks.example/kvwatch#kvwatchcontextnothonored",
        },
        generator_url="http://kvwatch.example:9464/probes/42",
    )


def resolved(state: AlertState, at: datetime) -> AlertState:
    return dataclasses.replace(state, state=AlertStatus.RESOLVED, ends_at=at, updated_at=at)


def delivery(
    urls: Sequence[str],
    outbox: Outbox,
    clock: Clock,
    registry: CollectorRegistry | None = None,
    **settings: object,
) -> tuple[Delivery, CollectorRegistry]:
    registry = registry or CollectorRegistry()
    built = Delivery(
        settings=AlertmanagerSettings(urls=tuple(urls), **settings),  # type: ignore[arg-type]
        load_states=outbox.load,
        registry=registry,
        clock=clock,
    )
    return built, registry


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def notifications(registry: CollectorRegistry, kind: str, alertmanager: str) -> float:
    """kvwatch_alertmanager_notifications_<kind>_total for one Alertmanager."""
    name = f"kvwatch_alertmanager_notifications_{kind}_total"
    return sample(registry, name, alertmanager=alertmanager)
