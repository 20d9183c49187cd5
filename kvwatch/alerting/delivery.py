"""The delivery loop: reads alert states (the outbox) and keeps every Alertmanager told.

Deciding is apart from delivering: the runner writes state changes with the probe result in
one transaction; this loop reads the current states and sends what is due, so a crash
between the two loses nothing, and a restart re-sends every firing alert with its original
``startsAt`` (Alertmanager merges it into the alert it has, or learns it again).

Due, per Alertmanager, as Prometheus' rule manager decides it: a firing alert is sent when it
changed and then every resend interval with ``endsAt = now + 4 x resend interval`` (so an
Alertmanager that stops hearing from kvwatch resolves it by itself); a resolved alert is sent
with its resolution time as ``endsAt`` and re-sent for ``resolved_retention`` (15 minutes),
so an Alertmanager that was down at the moment still learns of it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kvwatch.alerting.alertmanager import (
    MAX_BATCH,
    AlertmanagerClient,
    AlertmanagerSettings,
    Outcome,
    build_http_client,
    postable_alert,
)
from kvwatch.alerting.policy import ALERTNAMES
from kvwatch.alerting.state import StoredAlertState

# Never sleep less than this between cycles: a clock that does not move (or a due time in the
# past) must not turn the loop into a busy spin.
_MIN_SLEEP = 0.2


LoadStates = Callable[[], Awaitable[Sequence[StoredAlertState]]]
Clock = Callable[[], datetime]
_Key = tuple[str, str, str]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class DeliveryMetrics:
    """Delivery's metrics, registered in the registry it is given."""

    def __init__(self, registry: CollectorRegistry) -> None:
        by_am = ["alertmanager"]
        self.sent = Counter(
            "kvwatch_alertmanager_notifications_sent",
            "Alerts accepted by an Alertmanager (2xx).",
            by_am,
            registry=registry,
        )
        self.errors = Counter(
            "kvwatch_alertmanager_notifications_errors",
            "Alerts an Alertmanager did not accept: 4xx, 5xx or network error.",
            by_am,
            registry=registry,
        )
        self.dropped = Counter(
            "kvwatch_alertmanager_notifications_dropped",
            "Alerts dropped without retry because an Alertmanager rejected them (4xx).",
            by_am,
            registry=registry,
        )
        self.latency = Histogram(
            "kvwatch_alertmanager_notification_latency_seconds",
            "Time to POST one batch of alerts to an Alertmanager.",
            by_am,
            registry=registry,
        )
        self.queue_length = Gauge(
            "kvwatch_alertmanager_queue_length",
            "Alert notifications due but not yet accepted, waiting for a retry.",
            registry=registry,
        )
        self.firing = Gauge(
            "kvwatch_alerts_firing",
            "Alerts firing now, by alert name.",
            ["alertname"],
            registry=registry,
        )


@dataclass(frozen=True, slots=True)
class _Sent:
    fingerprint: tuple[Any, ...]
    at: datetime


@dataclass(slots=True)
class _Due:
    key: _Key
    fingerprint: tuple[Any, ...]
    payload: dict[str, Any]


class Delivery:
    """Sends due alerts to every configured Alertmanager; ``run()`` until cancelled.

    ``load_states`` returns the current alert states (at least every firing one and every
    one resolved within ``resolved_retention``; others are ignored). Call :meth:`notify`
    after committing a state change so it goes out now rather than at the next resend.
    """

    def __init__(
        self,
        *,
        settings: AlertmanagerSettings,
        load_states: LoadStates,
        registry: CollectorRegistry,
        http: httpx.AsyncClient | None = None,
        clock: Clock = _utcnow,
        alertnames: Iterable[str] = ALERTNAMES,
    ) -> None:
        self._settings = settings
        self._load = load_states
        self._owns_http = http is None
        self._http = http if http is not None else build_http_client(settings)
        self._clients = [AlertmanagerClient(url, self._http) for url in settings.urls]
        self._clock = clock
        self._metrics = DeliveryMetrics(registry)
        self._log = structlog.get_logger("kvwatch.alerting.delivery")
        self._wake = asyncio.Event()
        # Per Alertmanager: what it last accepted of each alert, and when a failed one may be
        # tried again. In memory on purpose: after a restart everything is sent again.
        # Bounded by the live alerts: every cycle drops the keys of alerts no longer sent.
        self._sent: dict[str, dict[_Key, _Sent]] = {c.name: {} for c in self._clients}
        self._retry_at: dict[str, dict[_Key, datetime]] = {c.name: {} for c in self._clients}
        self._resend = timedelta(seconds=settings.resend_interval)
        self._retention = timedelta(seconds=settings.resolved_retention)
        self._retry = timedelta(seconds=settings.retry_interval)
        # Bounded by the policy's alert names (an unknown one in the store is added once).
        self._known_alertnames = set(alertnames)
        for client in self._clients:
            # Zero series from the start, so rate() and absent() work before the first page.
            for metric in (self._metrics.sent, self._metrics.errors, self._metrics.dropped):
                metric.labels(alertmanager=client.name)
        for name in self._known_alertnames:
            self._metrics.firing.labels(alertname=name).set(0)

    @property
    def alertmanagers(self) -> list[str]:
        """The ``alertmanager`` label of each configured Alertmanager."""
        return [c.name for c in self._clients]

    def notify(self) -> None:
        """A state changed: run a cycle now instead of at the next resend."""
        self._wake.set()

    async def run(self) -> None:
        """Deliver until cancelled. A failing cycle (store down) is logged and retried."""
        while True:
            self._wake.clear()
            try:
                next_due = await self.send_due()
            except Exception:
                self._log.exception("alert delivery cycle failed")
                next_due = self._clock() + self._retry
            sleep = (next_due - self._clock()).total_seconds()
            sleep = min(max(sleep, _MIN_SLEEP), self._settings.resend_interval)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=sleep)

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def send_due(self) -> datetime:
        """One cycle: send every due alert to every Alertmanager. Returns when the next is due."""
        now = self._clock()
        records = list(await self._load())
        self._update_firing(records)
        live = [r for r in records if self._is_live(r, now)]
        live_keys = {_key(r) for r in live}
        for client in self._clients:
            # Forget alerts no longer sent (inactive, pending, past retention).
            self._sent[client.name] = {
                k: v for k, v in self._sent[client.name].items() if k in live_keys
            }
            self._retry_at[client.name] = {
                k: v for k, v in self._retry_at[client.name].items() if k in live_keys
            }
        await asyncio.gather(*(self._send_to(client, live, now) for client in self._clients))
        waiting = sum(len(r) for r in self._retry_at.values())
        self._metrics.queue_length.set(waiting)
        return self._next_due(now)

    def _is_live(self, record: StoredAlertState, now: datetime) -> bool:
        if record.state == "firing":
            return True
        if record.state == "resolved" and record.ends_at is not None:
            return now - record.ends_at <= self._retention
        return False

    def _payload(self, record: StoredAlertState, now: datetime) -> dict[str, Any]:
        if record.state == "firing":
            ends_at = now + 4 * self._resend
        else:
            assert record.ends_at is not None  # _is_live admits no resolved alert without one
            ends_at = record.ends_at
        return postable_alert(
            labels=record.labels,
            annotations=record.annotations,
            starts_at=record.starts_at,
            ends_at=ends_at,
            generator_url=record.generator_url,
        )

    def _due_for(self, name: str, live: list[StoredAlertState], now: datetime) -> list[_Due]:
        due = []
        for record in live:
            key, fingerprint = _key(record), _fingerprint(record)
            retry_at = self._retry_at[name].get(key)
            if retry_at is not None and now < retry_at:
                continue
            sent = self._sent[name].get(key)
            if sent is None or sent.fingerprint != fingerprint or now - sent.at >= self._resend:
                due.append(_Due(key, fingerprint, self._payload(record, now)))
        return due

    async def _send_to(
        self, client: AlertmanagerClient, live: list[StoredAlertState], now: datetime
    ) -> None:
        due = self._due_for(client.name, live, now)
        for start in range(0, len(due), MAX_BATCH):
            batch = due[start : start + MAX_BATCH]
            began = asyncio.get_running_loop().time()
            result = await client.post([d.payload for d in batch])
            self._metrics.latency.labels(client.name).observe(
                asyncio.get_running_loop().time() - began
            )
            count = len(batch)
            log = self._log.bind(alertmanager=client.name, alerts=count, detail=result.detail)
            if result.outcome is Outcome.FAILED:
                self._metrics.errors.labels(client.name).inc(count)
                for d in batch:
                    self._retry_at[client.name][d.key] = now + self._retry
                log.warning("alertmanager unreachable; will retry")
                continue
            for d in batch:
                # A rejected batch is remembered as sent: it is not retried until it changes
                # or its next resend, because the same payload would be rejected again.
                self._sent[client.name][d.key] = _Sent(d.fingerprint, now)
                self._retry_at[client.name].pop(d.key, None)
            if result.outcome is Outcome.REJECTED:
                self._metrics.errors.labels(client.name).inc(count)
                self._metrics.dropped.labels(client.name).inc(count)
                log.error("alertmanager rejected alerts; dropped (a kvwatch bug or bad auth)")
            else:
                self._metrics.sent.labels(client.name).inc(count)
                log.debug("alerts sent")

    def _next_due(self, now: datetime) -> datetime:
        candidates = [now + self._resend]
        for name in self._sent:
            candidates.extend(s.at + self._resend for s in self._sent[name].values())
            candidates.extend(self._retry_at[name].values())
        return min(candidates)

    def _update_firing(self, records: list[StoredAlertState]) -> None:
        counts = dict.fromkeys(self._known_alertnames, 0)
        for record in records:
            if record.state == "firing":
                counts[record.alertname] = counts.get(record.alertname, 0) + 1
        self._known_alertnames |= counts.keys()
        for name, count in counts.items():
            self._metrics.firing.labels(alertname=name).set(count)


def _key(record: StoredAlertState) -> _Key:
    return (record.alertname, record.endpoint, record.probe)


def _fingerprint(record: StoredAlertState) -> tuple[Any, ...]:
    """What, when it changes, must reach Alertmanager now rather than at the next resend."""
    return (
        record.state,
        record.starts_at,
        record.ends_at,
        tuple(sorted(record.labels.items())),
        tuple(sorted(record.annotations.items())),
        record.generator_url,
    )
