"""The runner's alerting hook: probe result → alert-state changes → delivery wake-up.

It keeps the current alert states in memory (loaded from the store at start, so a restart
neither forgets a firing alert nor pages it again as new), asks the pure state machine what a
result changes, and hands the changed states to the runner, which writes them in the same
transaction as the probe result. Only after that commit are they adopted here and delivery
woken: a crash between deciding and storing loses nothing and invents nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import UTC, datetime, timedelta

from kvwatch.alerting.policy import AlertingPolicy
from kvwatch.alerting.state import (
    AlertKey,
    AlertState,
    AlertStatus,
    Evidence,
    ProbeEvent,
    evaluate,
    with_served_window,
)
from kvwatch.probe.model import WINDOW_KINDS, ProbeReport, Target, describe_served
from kvwatch.store.records import AlertStateRecord, ServedWindowRecord

# The annotation that says why an alert resolved without a recovery (its endpoint went).
RESOLVED_REASON = "resolved_reason"

# How long a removed endpoint's resolved alerts stay in memory: as long as delivery re-sends
# a resolution (AlertmanagerSettings.resolved_retention's default), so every Alertmanager
# learns of it; after that they are dropped, or a fleet that churns would keep them all.
KEEP_RETIRED = timedelta(minutes=15)

# Probe kinds whose failures the served window explains.
_WINDOW_PROBES = frozenset(k.value for k in WINDOW_KINDS)
# The states retire() ends: a late probe must not bring them back.
_ACTIVE = frozenset({AlertStatus.FIRING, AlertStatus.PENDING})


def _served_sentence(report: ProbeReport, target: Target) -> str | None:
    record = target.served
    if record is None or not record.measured or report.kind.value not in _WINDOW_PROBES:
        return None
    return describe_served(record)


class AlertEvaluator:
    def __init__(
        self,
        *,
        policy: AlertingPolicy,
        states: Iterable[AlertStateRecord],
        probe_url: Callable[[int], str],
        wake: Callable[[], None] = lambda: None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        keep_retired: timedelta = KEEP_RETIRED,
    ) -> None:
        self._policy = policy
        # At most a few states per configured endpoint (alert name x probe kind); a removed
        # endpoint's go once their resolution has been re-sent (keep_retired).
        self._states = {s.key: s for s in map(AlertState.from_record, states)}
        # Endpoints removed by a reload, and when (at most those removed in keep_retired).
        self._retired: dict[str, datetime] = {}
        # Per retired endpoint, the states a probe judged before its removal and stored after
        # it (committed refused them): their database rows must be written over again.
        self._refused: dict[str, dict[AlertKey, AlertState]] = {}
        self._keep_retired = keep_retired
        self._probe_url = probe_url
        self.wake = wake
        self._clock = clock

    def evaluate(self, report: ProbeReport, target: Target) -> Sequence[AlertStateRecord]:
        if report.endpoint in self._retired:
            # A probe in flight when its endpoint was removed: judging it would fire again
            # an alert that retire() resolved, and nothing would ever resolve it.
            return []
        spec = target.spec
        event = ProbeEvent(
            endpoint=report.endpoint,
            model=spec.model,
            probe=report.kind.value,
            verdict=report.verdict,
            probe_id=report.probe_id,
            confirmation=report.confirms_probe_id is not None,
            confirm_enabled=spec.confirm,
            evidence=Evidence(
                reason=report.reason,
                planned_tokens=report.planned_prompt_tokens,
                reported_tokens=report.reported_prompt_tokens,
                status=report.status,
                marker_found=report.marker_found,
                foreign=report.foreign,
                served_window=_served_sentence(report, target),
            ),
            # A result still waiting for the database has no page to link to yet.
            generator_url=(None if report.probe_id is None else self._probe_url(report.probe_id)),
            labels=dict(spec.labels),
            tenant=report.tenant,
        )
        changes = evaluate(self._states, event, self._policy, self._clock())
        return [AlertStateRecord(**dataclasses.asdict(c)) for c in changes]

    def committed(self, records: Sequence[AlertStateRecord]) -> None:
        for record in records:
            state = AlertState.from_record(record)
            if state.endpoint in self._retired and state.state in _ACTIVE:
                # A probe judged before its endpoint's removal and stored after it: adopted,
                # it would undo retire()'s resolution and page for good (nothing probes the
                # endpoint any more). Its row, written with the probe, is put right by
                # corrections() once the endpoint's last probe has ended.
                self._refused.setdefault(state.endpoint, {})[state.key] = state
                continue
            self._states[state.key] = state
        self._forget_retired()
        if records:
            self.wake()

    def served_window(self, endpoint: str, record: ServedWindowRecord) -> list[AlertStateRecord]:
        """The endpoint's active window alerts (raised by under or edge probes) with the
        measured served window in their description: the next re-send carries it. None for a
        record that measures nothing (the advertised window served again), as
        :func:`_served_sentence` gives no sentence for one."""
        if not record.measured:
            return []
        sentence = describe_served(record)
        now = self._clock()
        changed = []
        for state in self._states.values():
            if (
                state.endpoint != endpoint
                or state.state not in ("firing", "pending")
                or state.probe not in _WINDOW_PROBES
            ):
                continue
            description = with_served_window(state.annotations.get("description", ""), sentence)
            annotations = {**state.annotations, "description": description}
            changed.append(dataclasses.replace(state, annotations=annotations, updated_at=now))
        return [AlertStateRecord(**dataclasses.asdict(c)) for c in changed]

    def retire(self, endpoint: str, reason: str) -> list[AlertStateRecord]:
        """An endpoint is no longer probed: resolve its firing alerts, saying why in their
        ``resolved_reason`` annotation (nothing recovered: the checks stopped), and drop its
        pending ones.

        Its states are forgotten ``keep_retired`` later (unless :meth:`revive` says it is back).
        """
        now = self._clock()
        self._retired[endpoint] = now
        return self._ended(endpoint, None, reason, now)

    def retire_probes(
        self, endpoint: str, probes: Collection[str], reason: str
    ) -> list[AlertStateRecord]:
        """``endpoint`` stays, but its ``probes`` (kinds) no longer run: their firing alerts
        resolve with ``reason`` and their pending ones go, as :meth:`retire` does for a whole
        endpoint. Called once the endpoint's probes in flight have ended, so none of those
        kinds can report again; adopted by :meth:`committed` once stored."""
        return self._ended(endpoint, probes, reason, self._clock())

    def _ended(
        self, endpoint: str, probes: Collection[str] | None, reason: str, now: datetime
    ) -> list[AlertStateRecord]:
        records = []
        for state in self._states.values():
            if state.endpoint != endpoint or state.state not in ("firing", "pending"):
                continue
            if probes is not None and state.probe not in probes:
                continue
            if state.state == "firing":
                retired = dataclasses.replace(
                    state,
                    state=AlertStatus.RESOLVED,
                    ends_at=now,
                    updated_at=now,
                    annotations={**state.annotations, RESOLVED_REASON: reason},
                )
            else:
                retired = dataclasses.replace(
                    state, state=AlertStatus.INACTIVE, failures=0, updated_at=now
                )
            records.append(AlertStateRecord(**dataclasses.asdict(retired)))
        return records

    def revive(self, endpoint: str) -> None:
        """``endpoint`` is configured again: its states are its own again, not to be dropped."""
        self._retired.pop(endpoint, None)
        self._refused.pop(endpoint, None)

    def corrections(self, endpoint: str) -> list[AlertStateRecord]:
        """For a retired endpoint whose last probes have ended: the states to write over the
        rows those probes stored after :meth:`retire` (see :meth:`committed`), as retire left
        them (resolved, or inactive for an alert they opened); [] when there were none."""
        refused = self._refused.pop(endpoint, {})
        now = self._clock()
        records = []
        for key, late in refused.items():
            state = self._states.get(key) or dataclasses.replace(
                late, state=AlertStatus.INACTIVE, failures=0, updated_at=now
            )
            records.append(AlertStateRecord(**dataclasses.asdict(state)))
        return records

    def _forget_retired(self) -> None:
        if not self._retired:
            return
        cutoff = self._clock() - self._keep_retired
        gone = {e for e, at in self._retired.items() if at <= cutoff}
        if not gone:
            return
        self._states = {k: s for k, s in self._states.items() if s.endpoint not in gone}
        for endpoint in gone:
            del self._retired[endpoint]
            self._refused.pop(endpoint, None)

    def held(self) -> dict[str, set[str]]:
        """The probe kinds with a state held, by endpoint."""
        held: dict[str, set[str]] = {}
        for state in self._states.values():
            held.setdefault(state.endpoint, set()).add(state.probe)
        return held

    @property
    def state_count(self) -> int:
        """States held (not ``__len__``: an evaluator holding none must stay truthy, the
        runner tests its alert hook with ``if``)."""
        return len(self._states)

    def records(self) -> list[AlertStateRecord]:
        """Every current state: what delivery sends (from memory, so paging goes on while
        the database is unreachable)."""
        self._forget_retired()
        return [AlertStateRecord(**dataclasses.asdict(s)) for s in self._states.values()]

    def firing(self) -> list[AlertKey]:
        return [k for k, s in self._states.items() if s.state == "firing"]
