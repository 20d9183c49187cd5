"""The alert state machine: one probe verdict in, the alert states it changed out.

Pure: no I/O, no clock (``now`` is passed in). One state per (alertname, endpoint, probe):

    inactive ──failure──▶ pending ──confirmed──▶ firing ──M recoveries──▶ resolved
       ▲                     │                                             │
       └──────recovery───────┘              new failure: pending again ◀───┘

A critical verdict goes *pending* and fires on the failing confirmation probe the runner
sends at once (DESIGN §2); a passing confirmation is a flake and returns the alert to inactive.
Warnings fire after ``fire_after`` failing verdicts since the last recovery. While an
endpoint's baseline is failing, its boundary alerts stay pending: a model that cannot recall a
marker from a short prompt must not page anyone about long ones (a leak pages regardless).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import NamedTuple, Protocol

from kvwatch.alerting.policy import (
    BASELINE_PROBE,
    BOUNDARY_PROBES,
    CANARY_INEFFECTIVE,
    CAPACITY_PROBE,
    EDGE_PROBE,
    REGION_LABEL,
    SOURCE_TENANT_LABEL,
    TENANT_LABEL,
    AlertingPolicy,
    AlertPolicy,
)
from kvwatch.canary.model import INCONCLUSIVE, ForeignMarker, Severity, Verdict

# A description lists this many foreign markers; the probe page has the rest.
_MAX_FOREIGN_IN_DESCRIPTION = 3


class AlertStatus(enum.StrEnum):
    INACTIVE = "inactive"
    PENDING = "pending"
    FIRING = "firing"
    RESOLVED = "resolved"


class AlertKey(NamedTuple):
    alertname: str
    endpoint: str
    probe: str  # probe kind; "" for endpoint-level checks (the engine's capacity self-report)


class StoredAlertState(Protocol):
    """What :meth:`AlertState.from_record` and the delivery loop read: the store's
    ``AlertStateRecord`` fits."""

    @property
    def alertname(self) -> str: ...
    @property
    def endpoint(self) -> str: ...
    @property
    def probe(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def severity(self) -> str: ...
    @property
    def updated_at(self) -> datetime: ...
    @property
    def failures(self) -> int: ...
    @property
    def passes(self) -> int: ...
    @property
    def starts_at(self) -> datetime | None: ...
    @property
    def ends_at(self) -> datetime | None: ...
    @property
    def last_probe_id(self) -> int | None: ...
    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def annotations(self) -> Mapping[str, str]: ...
    @property
    def generator_url(self) -> str | None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertState:
    """One alert's state. Field for field the store's ``AlertStateRecord``, so
    ``AlertStateRecord(**dataclasses.asdict(state))`` persists it."""

    alertname: str
    endpoint: str
    probe: str
    state: AlertStatus
    severity: str
    updated_at: datetime
    failures: int = 0  # failing verdicts for this alert since the last recovery
    passes: int = 0  # consecutive recovering verdicts while firing
    starts_at: datetime | None = None  # when it fired; stable until it resolves
    ends_at: datetime | None = None  # when it resolved
    last_probe_id: int | None = None  # the probe whose verdict last raised it
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    generator_url: str | None = None

    def __post_init__(self) -> None:
        # Accept the plain string a store row holds; the machine compares enum members.
        object.__setattr__(self, "state", AlertStatus(self.state))

    @property
    def key(self) -> AlertKey:
        return AlertKey(self.alertname, self.endpoint, self.probe)

    @classmethod
    def from_record(cls, record: StoredAlertState) -> AlertState:
        return cls(
            alertname=record.alertname,
            endpoint=record.endpoint,
            probe=record.probe,
            state=AlertStatus(record.state),
            severity=record.severity,
            updated_at=record.updated_at,
            failures=record.failures,
            passes=record.passes,
            starts_at=record.starts_at,
            ends_at=record.ends_at,
            last_probe_id=record.last_probe_id,
            labels=dict(record.labels),
            annotations=dict(record.annotations),
            generator_url=record.generator_url,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Evidence:
    """The facts an on-call engineer reads in the page, taken from the probe's judgement."""

    reason: str = ""
    planned_tokens: int | None = None
    reported_tokens: int | None = None
    status: int | None = None
    marker_found: bool | None = None
    foreign: tuple[ForeignMarker, ...] = ()
    # What the endpoint really serves, once measured after a window failure: one sentence
    # ("Served window: advertised … · served …"), the answer to on-call's first question.
    served_window: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeEvent:
    """One finished probe, as the state machine needs it."""

    endpoint: str
    model: str
    probe: str  # a ProbeKind value, or "" for an endpoint-level check
    verdict: Verdict
    probe_id: int | None = None
    confirmation: bool = False  # this probe re-checks a critical verdict just seen
    confirm_enabled: bool = True  # the runner re-checks critical verdicts before paging
    evidence: Evidence = Evidence()
    generator_url: str | None = None  # the probe's page in kvwatch
    labels: Mapping[str, str] = field(default_factory=dict)  # the endpoint's static labels
    tenant: str | None = None  # whose credentials the probe was sent with (a name)

    @property
    def source_tenant(self) -> str | None:
        """The tenant of the first foreign marker issued under another tenant, if any."""
        return next(
            (
                f.tenant
                for f in self.evidence.foreign
                if f.tenant is not None and self.tenant is not None and f.tenant != self.tenant
            ),
            None,
        )


def evaluate(
    states: Mapping[AlertKey, AlertState],
    event: ProbeEvent,
    policy: AlertingPolicy,
    now: datetime,
) -> list[AlertState]:
    """The states ``event`` changes, each with ``updated_at=now``; ``states`` is left as is.

    ``states`` must hold at least every known state of ``event.endpoint`` (its baseline state
    decides whether boundary alerts may fire). A verdict raises at most one alert; it counts
    as a recovery (or breaks a recovery streak) for every other alert of the same endpoint
    and probe kind; a capacity pass is also a recovery for the edge probe's alerts. An
    inconclusive verdict (``throttled``, ``sizing_miss``) changes nothing.
    """
    verdict = Verdict(event.verdict)
    if verdict in INCONCLUSIVE:
        return []
    raised = policy.alert_for(verdict)
    keys = {k for k in states if k.endpoint == event.endpoint and k.probe == event.probe}
    if event.probe == CAPACITY_PROBE and verdict is Verdict.PASS:
        # The KV pool now holds the window (an engine redeployed with the gap closed): the
        # edge probe, run only over a gap, will not run again to recover its own alerts, so
        # this pass is their recovery, or they would stay firing for good.
        keys |= {
            k
            for k in states
            if k.endpoint == event.endpoint
            and k.probe == EDGE_PROBE
            and k.alertname in policy.alerts
            and Verdict.PASS in policy.alerts[k.alertname].recovers_on
        }
    if raised is not None:
        keys.add(AlertKey(raised.alertname, event.endpoint, event.probe))
    held = _baseline_failing(states, event.endpoint)

    changed: list[AlertState] = []
    for key in sorted(keys):
        alert = policy.alerts.get(key.alertname)
        if alert is None:
            # A state left by an alert no longer in the policy: nothing decides it any more.
            continue
        old = states.get(key) or _inactive(key, alert, now)
        if alert is raised:
            hold = held and alert.suppressed_by_canary and event.probe in BOUNDARY_PROBES
            new = _on_failure(old, alert, event, policy, now, hold=hold)
        elif verdict in alert.recovers_on:
            new = _on_recovery(old, alert, now)
        else:
            new = _on_other_verdict(old)
        if new != old:
            changed.append(dataclasses.replace(new, updated_at=now))
    return changed


def _baseline_failing(states: Mapping[AlertKey, AlertState], endpoint: str) -> bool:
    # The baseline's own: a burst whose solo request fails its two-fact task says nothing of
    # the model's recall of one marker, which is what explains boundary failures away.
    return any(
        state.state in (AlertStatus.PENDING, AlertStatus.FIRING)
        for key, state in states.items()
        if key.alertname == CANARY_INEFFECTIVE
        and key.endpoint == endpoint
        and key.probe == BASELINE_PROBE
    )


def _inactive(key: AlertKey, alert: AlertPolicy, now: datetime) -> AlertState:
    return AlertState(
        alertname=key.alertname,
        endpoint=key.endpoint,
        probe=key.probe,
        state=AlertStatus.INACTIVE,
        severity=alert.severity.value,
        updated_at=now,
    )


def _on_failure(
    old: AlertState,
    alert: AlertPolicy,
    event: ProbeEvent,
    policy: AlertingPolicy,
    now: datetime,
    *,
    hold: bool,
) -> AlertState:
    failures = old.failures + 1
    status: AlertStatus
    if old.state is AlertStatus.FIRING:
        # Labels and startsAt stay as they were: they are the alert's identity in Alertmanager.
        status, starts_at, labels, severity = old.state, old.starts_at, old.labels, old.severity
    else:
        if alert.severity is Severity.CRITICAL and (
            event.confirmation or not event.confirm_enabled
        ):
            confirmed = True
        else:
            confirmed = failures >= alert.fire_after
        fires = confirmed and not hold
        status = AlertStatus.FIRING if fires else AlertStatus.PENDING
        starts_at = now if fires else None
        labels = _labels(alert, event, policy)
        severity = alert.severity.value
    return dataclasses.replace(
        old,
        state=status,
        severity=severity,
        failures=failures,
        passes=0,
        starts_at=starts_at,
        ends_at=None,
        last_probe_id=event.probe_id,
        labels=labels,
        annotations=_annotations(alert, event, policy),
        generator_url=event.generator_url,
    )


def _on_recovery(old: AlertState, alert: AlertPolicy, now: datetime) -> AlertState:
    if old.state is AlertStatus.FIRING:
        passes = old.passes + 1
        if passes >= alert.resolve_after:
            return dataclasses.replace(
                old, state=AlertStatus.RESOLVED, failures=0, passes=passes, ends_at=now
            )
        return dataclasses.replace(old, failures=0, passes=passes)
    if old.state is AlertStatus.PENDING:
        # Never confirmed: a flake, or a streak broken before it was long enough.
        return dataclasses.replace(old, state=AlertStatus.INACTIVE, failures=0, passes=0)
    return dataclasses.replace(old, failures=0)


def _on_other_verdict(old: AlertState) -> AlertState:
    # Another failure of the same probe is no evidence of recovery: it breaks the streak of
    # recoveries but says nothing for or against this alert's own failure count.
    if old.state is AlertStatus.FIRING:
        return dataclasses.replace(old, passes=0)
    return old


def _labels(alert: AlertPolicy, event: ProbeEvent, policy: AlertingPolicy) -> dict[str, str]:
    # Later wins: the endpoint's labels refine the global ones, and kvwatch's own labels can
    # never be overridden by configuration.
    labels = {
        **policy.static_labels,
        **event.labels,
        "alertname": alert.alertname,
        "severity": alert.severity.value,
        "endpoint": event.endpoint,
        "model": event.model,
        "probe": event.probe,
    }
    if policy.region is not None:
        labels[REGION_LABEL] = policy.region
    if alert.tenant_labels:
        labels[TENANT_LABEL] = event.tenant or ""
        labels[SOURCE_TENANT_LABEL] = event.source_tenant or ""
    return labels


def _annotations(alert: AlertPolicy, event: ProbeEvent, policy: AlertingPolicy) -> dict[str, str]:
    summary = alert.summary.format(
        endpoint=event.endpoint,
        probe=event.probe or "capacity",
        model=event.model,
        tenant=event.tenant or "-",
        source_tenant=event.source_tenant or "-",
    )
    return {
        "summary": summary,
        "description": describe(event, region=policy.region),
        "runbook_url": policy.runbook_url(alert.alertname),
    }


def describe(event: ProbeEvent, *, region: str | None = None) -> str:
    """The evidence of one probe as sentences, for the alert's ``description``; in
    multi-region mode it names the region that ran the probe."""
    ev = event.evidence
    what = f"{event.probe} probe" if event.probe else "capacity check"
    probe_id = f" {event.probe_id}" if event.probe_id is not None else ""
    kind = " (a confirmation re-check)" if event.confirmation else ""
    sentences = [
        f"The {what}{probe_id}{kind} of {event.endpoint} ({event.model}) "
        + (f"under tenant {event.tenant} " if event.tenant is not None else "")
        + (f"from region {region} " if region is not None else "")
        + f"ended in verdict {Verdict(event.verdict).value}"
        + (f": {ev.reason.rstrip('.')}." if ev.reason else ".")
    ]
    if ev.planned_tokens is not None or ev.reported_tokens is not None:
        planned = "?" if ev.planned_tokens is None else str(ev.planned_tokens)
        reported = "none" if ev.reported_tokens is None else str(ev.reported_tokens)
        sentences.append(f"Planned {planned} prompt tokens; the engine reported {reported}.")
    if ev.status is not None:
        sentences.append(f"HTTP status {ev.status}.")
    elif event.probe:
        sentences.append("No HTTP status (the request did not complete).")
    if ev.marker_found is not None:
        sentences.append(f"Marker found: {'yes' if ev.marker_found else 'no'}.")
    for foreign in ev.foreign[:_MAX_FOREIGN_IN_DESCRIPTION]:
        issued = foreign.issued_at.astimezone(UTC).isoformat(timespec="seconds")
        under = f" under tenant {foreign.tenant}" if foreign.tenant is not None else ""
        sentences.append(
            f"The answer holds the marker of probe {foreign.probe_id}, "
            f"issued to {foreign.endpoint}{under} at {issued}."
        )
    if len(ev.foreign) > _MAX_FOREIGN_IN_DESCRIPTION:
        more = len(ev.foreign) - _MAX_FOREIGN_IN_DESCRIPTION
        sentences.append(f"{more} more foreign markers are listed on the probe page.")
    if ev.served_window:
        sentences.append(ev.served_window)
    return " ".join(sentences)


SERVED_WINDOW_PREFIX = "Served window:"


def with_served_window(description: str, sentence: str) -> str:
    """``description`` with its served-window sentence replaced by (or ended with) this one."""
    head, _, _ = description.partition(f" {SERVED_WINDOW_PREFIX}")
    return f"{head} {sentence}"
