"""Which verdicts raise which alert, and how many probes it takes to fire and to resolve.

Pure data: no I/O. :func:`default_policy` builds the shipped rules (DESIGN §6); a deployment
tunes one alert with ``overrides={"KVWatchWindowNotServed": {"fire_after": 5}}``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from kvwatch.canary.model import HEALTHY, INCONCLUSIVE, Severity, Verdict

CROSS_REQUEST_LEAK = "KVWatchCrossRequestLeak"
CROSS_TENANT_LEAK = "KVWatchCrossTenantLeak"
CONTEXT_NOT_HONORED = "KVWatchContextNotHonored"
LIMIT_NOT_ENFORCED = "KVWatchLimitNotEnforced"
CAPACITY_MISMATCH = "KVWatchCapacityMismatch"
WINDOW_NOT_SERVED = "KVWatchWindowNotServed"
WRONG_REJECTION = "KVWatchWrongRejection"
PROBE_FAILING = "KVWatchProbeFailing"
CANARY_INEFFECTIVE = "KVWatchCanaryIneffective"
BURST_WRONG = "KVWatchBurstWrong"
CACHE_CORRUPT = "KVWatchCacheCorrupt"
# Every alert kvwatch raises (DESIGN §6): delivery starts each one's firing gauge at zero.
ALERTNAMES = (
    CROSS_REQUEST_LEAK,
    CROSS_TENANT_LEAK,
    CONTEXT_NOT_HONORED,
    LIMIT_NOT_ENFORCED,
    CAPACITY_MISMATCH,
    WINDOW_NOT_SERVED,
    WRONG_REJECTION,
    PROBE_FAILING,
    CANARY_INEFFECTIVE,
    BURST_WRONG,
    CACHE_CORRUPT,
)

DEFAULT_RUNBOOK_BASE = "https://github.com/kvwatch/kvwatch/blob/main/docs/runbooks.md"

# Probe kinds whose alerts depend on the model's recall and on the window edge: these are the
# ones a failing baseline can explain away (DESIGN §1, "a weak model does not page anyone").
BOUNDARY_PROBES = frozenset({"under", "over"})
# The probe whose canary_ineffective holds them back (a burst's says nothing of recall).
BASELINE_PROBE = "baseline"
# The capacity check, and the edge probe it runs only while the KV pool is smaller than the
# window: a capacity pass recovers the edge probe's alerts (kvwatch.alerting.state).
CAPACITY_PROBE = "capacity"
EDGE_PROBE = "edge"

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# Labels kvwatch sets itself; static labels from config may not shadow them, or an alert's
# identity would depend on configuration rather than on what failed.
RESERVED_LABELS = frozenset({"alertname", "severity", "endpoint", "model", "probe"})
# Set by kvwatch only in multi-region mode; without a region it is an ordinary label.
REGION_LABEL = "region"
# Set by kvwatch on alerts with ``tenant_labels``: who was served whose data.
TENANT_LABEL = "tenant"
SOURCE_TENANT_LABEL = "source_tenant"
_TUNABLE = frozenset({"fire_after", "resolve_after", "suppressed_by_canary", "severity"})

# Every verdict that is not an error of the probe itself shows the probe ran to completion,
# which is what KVWatchProbeFailing is about.
_PROBE_RAN = frozenset(Verdict) - {Verdict.ERROR, Verdict.AUTH_ERROR} - INCONCLUSIVE


class PolicyError(ValueError):
    """An alert policy that cannot work; ``str()`` is a sentence for a config error."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertPolicy:
    """How one alert is raised and cleared.

    ``fire_after``: consecutive failing verdicts (since the last recovery) that fire it. For a
    critical alert with confirmation enabled, a failing *confirmation* probe fires at once and
    ``fire_after`` is the fallback when the confirmation could not run (throttled, errored).
    ``resolve_after``: consecutive recovering verdicts that resolve a firing alert.
    """

    alertname: str
    severity: Severity
    verdicts: frozenset[Verdict]
    summary: str
    fire_after: int
    resolve_after: int
    # Boundary-probe alert held pending while the endpoint's baseline is failing.
    suppressed_by_canary: bool = True
    # A healthy answer clears an alert: over_truncated too, so an Ollama paged for
    # over_accepted by an older kvwatch resolves once its over probe is judged as it should be.
    recovers_on: frozenset[Verdict] = HEALTHY
    # Labelled with the tenant served (``tenant``) and the one its marker came from
    # (``source_tenant``), taken from the probe that fires it.
    tenant_labels: bool = False

    def __post_init__(self) -> None:
        if self.fire_after < 1:
            raise PolicyError(f"alerts.{self.alertname}.fire_after: must be a positive integer")
        if self.resolve_after < 1:
            raise PolicyError(f"alerts.{self.alertname}.resolve_after: must be a positive integer")
        if self.severity not in (Severity.CRITICAL, Severity.WARNING):
            raise PolicyError(f"alerts.{self.alertname}.severity: must be critical or warning")
        if self.verdicts & self.recovers_on:
            raise PolicyError(f"alerts.{self.alertname}: a verdict cannot both raise and clear it")


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertingPolicy:
    """All alert policies, plus what every alert carries: runbook links, static labels and,
    in multi-region mode, the region that saw the failure."""

    alerts: Mapping[str, AlertPolicy]
    runbook_base: str = DEFAULT_RUNBOOK_BASE
    static_labels: Mapping[str, str] = field(default_factory=dict)
    # Stable per deployment, so a label like the others; Alertmanager routes group without
    # it, so every region's alert for one failure lands in one notification.
    region: str | None = None

    def __post_init__(self) -> None:
        owner: dict[Verdict, str] = {}
        for name, alert in self.alerts.items():
            if name != alert.alertname:
                raise PolicyError(f"alerts.{name}: keyed under another name ({alert.alertname})")
            for verdict in alert.verdicts:
                if verdict in owner:
                    raise PolicyError(
                        f"alerts.{name}: verdict {verdict} already raises {owner[verdict]}"
                    )
                owner[verdict] = name
        for label in self.static_labels:
            if label in RESERVED_LABELS or (label == REGION_LABEL and self.region is not None):
                raise PolicyError(f"labels.{label}: is set by kvwatch and cannot be overridden")
            if not _LABEL_NAME.fullmatch(label):
                raise PolicyError(f"labels.{label}: is not a valid Prometheus label name")

    def alert_for(self, verdict: Verdict) -> AlertPolicy | None:
        """The alert ``verdict`` raises, or ``None`` (pass, throttled)."""
        for alert in self.alerts.values():
            if verdict in alert.verdicts:
                return alert
        return None

    def runbook_url(self, alertname: str) -> str:
        return f"{self.runbook_base}#{alertname.lower()}"


def _defaults() -> dict[str, AlertPolicy]:
    def alert(
        severity: Severity,
        name: str,
        verdicts: set[Verdict],
        summary: str,
        *,
        suppressed_by_canary: bool = True,
        recovers_on: frozenset[Verdict] = HEALTHY,
        tenant_labels: bool = False,
    ) -> AlertPolicy:
        critical = severity is Severity.CRITICAL
        return AlertPolicy(
            alertname=name,
            severity=severity,
            verdicts=frozenset(verdicts),
            summary=summary,
            # Critical: when the confirmation probe could not run, the next scheduled failure
            # confirms. Warning: a streak of three, so one bad answer does not open a ticket.
            fire_after=2 if critical else 3,
            # Critical: one clean answer after a confirmed corruption may be luck (another
            # cache layout); two in a row is a recovery.
            resolve_after=2 if critical else 1,
            suppressed_by_canary=suppressed_by_canary,
            recovers_on=recovers_on,
            tenant_labels=tenant_labels,
        )

    critical, warning = Severity.CRITICAL, Severity.WARNING
    alerts = [
        alert(
            critical,
            CROSS_REQUEST_LEAK,
            # burst_leak: the other request was one of the same burst, sent at once.
            {Verdict.FOREIGN_MARKER, Verdict.BURST_LEAK},
            "{endpoint} answered the {probe} canary with another request's data",
            # A leaked marker is proof whatever the model's recall ability: always pages.
            suppressed_by_canary=False,
        ),
        alert(
            critical,
            CROSS_TENANT_LEAK,
            {Verdict.CROSS_TENANT_LEAK},
            "{endpoint} answered tenant {tenant}'s {probe} canary with tenant "
            "{source_tenant}'s data",
            # One customer's data reached another: pages whatever the model's recall.
            suppressed_by_canary=False,
            # One alert per endpoint and probe kind, not per tenant pair: the fault is the
            # engine's shared cache, and which pair shows it depends on rotation and cache
            # layout. The pair that fired it is in its labels (stable while it fires, as
            # labels are its identity in Alertmanager); later pairs are in the description.
            tenant_labels=True,
        ),
        alert(
            critical,
            CONTEXT_NOT_HONORED,
            {Verdict.MARKER_MISSING, Verdict.TRUNCATED},
            "{endpoint} accepted the {probe} canary but did not attend to all of it",
        ),
        alert(
            critical,
            LIMIT_NOT_ENFORCED,
            {Verdict.OVER_ACCEPTED},
            "{endpoint} accepted a prompt beyond its context window",
        ),
        alert(
            critical,
            CAPACITY_MISMATCH,
            {Verdict.CAPACITY_MISMATCH},
            "{endpoint} advertises a context window larger than its KV pool",
            suppressed_by_canary=False,
        ),
        alert(
            warning,
            WINDOW_NOT_SERVED,
            {Verdict.UNDER_REJECTED},
            "{endpoint} rejects prompts within its advertised context window",
        ),
        alert(
            warning,
            WRONG_REJECTION,
            # A stream that breaks mid-answer is the engine failing inside a 200 instead of
            # rejecting cleanly: the same client-visible fault as a wrong over-limit rejection.
            {Verdict.WRONG_REJECTION, Verdict.STREAM_ERROR},
            "{endpoint} fails {probe} canaries without a clean context-length rejection",
        ),
        alert(
            warning,
            PROBE_FAILING,
            {Verdict.ERROR, Verdict.AUTH_ERROR},
            "kvwatch cannot complete {probe} probes against {endpoint}",
            # A transport or credential problem says nothing about recall; keep paging.
            suppressed_by_canary=False,
            recovers_on=_PROBE_RAN,
        ),
        alert(
            warning,
            CANARY_INEFFECTIVE,
            {Verdict.CANARY_INEFFECTIVE},
            "the model behind {endpoint} cannot recall a marker even from a short prompt",
            suppressed_by_canary=False,
        ),
        alert(
            critical,
            BURST_WRONG,
            {Verdict.BURST_WRONG},
            "{endpoint} answers concurrent requests wrong that it answers right one at a time",
            # The burst's own solo request is its canary: a model that cannot do the task
            # is canary_ineffective on that very probe, never this alert.
            suppressed_by_canary=False,
        ),
        alert(
            critical,
            CACHE_CORRUPT,
            {Verdict.CACHE_CORRUPT},
            "{endpoint} answers wrong from its prefix cache what it answers right without it",
            # The cache probe's cold step and control are its canary: a model that cannot
            # recall the facts is canary_ineffective on that very probe, never this alert.
            suppressed_by_canary=False,
        ),
    ]
    return {policy.alertname: policy for policy in alerts}


def default_policy(
    *,
    runbook_base: str = DEFAULT_RUNBOOK_BASE,
    static_labels: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, object]] | None = None,
    region: str | None = None,
) -> AlertingPolicy:
    """The shipped policy, with per-alert ``overrides`` of fire_after, resolve_after,
    suppressed_by_canary and severity."""
    alerts = _defaults()
    for name, changes in (overrides or {}).items():
        if name not in alerts:
            raise PolicyError(f"alerts.{name}: unknown alert (known: {', '.join(sorted(alerts))})")
        unknown = sorted(set(changes) - _TUNABLE)
        if unknown:
            raise PolicyError(f"alerts.{name}.{unknown[0]}: unknown key")
        values = dict(changes)
        for key in ("fire_after", "resolve_after"):
            if key in values and (
                isinstance(values[key], bool) or not isinstance(values[key], int)
            ):
                raise PolicyError(f"alerts.{name}.{key}: must be a positive integer")
        if "suppressed_by_canary" in values and not isinstance(
            values["suppressed_by_canary"], bool
        ):
            raise PolicyError(f"alerts.{name}.suppressed_by_canary: must be true or false")
        if "severity" in values:
            try:
                values["severity"] = Severity(str(values["severity"]))
            except ValueError:
                raise PolicyError(f"alerts.{name}.severity: must be critical or warning") from None
        alerts[name] = dataclasses.replace(alerts[name], **values)  # type: ignore[arg-type]
    return AlertingPolicy(
        alerts=alerts,
        runbook_base=runbook_base.rstrip("#"),
        static_labels=dict(static_labels or {}),
        region=region,
    )
