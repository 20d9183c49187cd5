"""Delivery against a real Alertmanager, with the webhook it notifies recording each page."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.alerting.delivery_scaffold import (
    Clock,
    Outbox,
    delivery,
    firing,
    notifications,
    resolved,
)
from tests.helpers.alertmanager import AlertmanagerProcess, RecordingServer, wait_until

pytestmark = pytest.mark.alertmanager


def webhook_alerts(webhook: RecordingServer) -> list[dict[str, Any]]:
    """Every alert in every notification the webhook got, in order."""
    return [alert for body in webhook.bodies() for alert in body["alerts"]]


async def wait_for(predicate: Any, what: str, timeout: float = 15) -> None:
    await asyncio.to_thread(wait_until, predicate, timeout, what)


def now() -> datetime:
    # Alertmanager judges endsAt against its own clock, so these tests run on real time.
    return datetime.now(UTC).replace(microsecond=0)


async def test_a_posted_alert_appears_in_alertmanager_with_its_exact_labels_and_annotations(
    alertmanager: AlertmanagerProcess,
) -> None:
    """GET /api/v2/alerts returns the alert as sent: labels, annotations, startsAt, link."""
    state = firing(now(), team="inference")
    sender, registry = delivery([alertmanager.url], Outbox(state), Clock())
    await sender.send_due()
    await sender.aclose()
    [held] = alertmanager.alerts()
    assert held["labels"] == state.labels
    assert held["annotations"] == state.annotations
    assert held["generatorURL"] == state.generator_url
    assert datetime.fromisoformat(held["startsAt"]) == state.starts_at
    assert held["status"]["state"] == "active"
    assert notifications(registry, "sent", f"{alertmanager.url}/api/v2/alerts") == 1


async def test_the_webhook_receives_the_firing_alert_then_its_resolution(
    alertmanager: AlertmanagerProcess, webhook: RecordingServer
) -> None:
    """Firing reaches the receiver; a resolved state (endsAt now) resolves it there too."""
    state = firing(now())
    outbox = Outbox(state)
    clock = Clock()
    sender, _ = delivery([alertmanager.url], outbox, clock)
    await sender.send_due()
    await wait_for(lambda: any(a["status"] == "firing" for a in webhook_alerts(webhook)), "firing")
    [page] = [a for a in webhook_alerts(webhook) if a["status"] == "firing"]
    assert page["labels"] == state.labels
    assert page["annotations"]["runbook_url"] == state.annotations["runbook_url"]

    clock.now = now()
    outbox.put(resolved(state, clock.now))
    await sender.send_due()
    await sender.aclose()
    await wait_for(
        lambda: any(a["status"] == "resolved" for a in webhook_alerts(webhook)), "resolution"
    )
    assert alertmanager.alerts() == []  # the v2 API lists no resolved alerts


async def test_a_restarted_alertmanager_gets_every_firing_alert_back_on_the_next_cycle(
    alertmanager: AlertmanagerProcess,
) -> None:
    """Down: errors counted and queued. Back up: the next cycle restores every firing alert."""
    started = now()
    outbox = Outbox(firing(started), firing(started, endpoint="other"))
    clock = Clock()
    sender, registry = delivery([alertmanager.url], outbox, clock, retry_interval=5)
    await sender.send_due()
    assert len(alertmanager.alerts()) == 2

    alertmanager.stop()
    alertmanager.start()
    assert alertmanager.alerts() == []  # Alertmanager keeps alerts in memory only

    # Still inside the resend interval: nothing due, the restarted Alertmanager stays empty.
    clock.now = now()
    await sender.send_due()
    assert alertmanager.alerts() == []

    alertmanager.stop()
    clock.now = now()
    clock.advance(61)
    await sender.send_due()
    am = f"{alertmanager.url}/api/v2/alerts"
    assert notifications(registry, "errors", am) == 2
    assert registry.get_sample_value("kvwatch_alertmanager_queue_length") == 2

    alertmanager.start()
    clock.advance(5)
    await sender.send_due()
    await sender.aclose()
    held = alertmanager.alerts()
    assert sorted(a["labels"]["endpoint"] for a in held) == ["glm-prod", "other"]
    assert {datetime.fromisoformat(a["startsAt"]) for a in held} == {started}
    assert registry.get_sample_value("kvwatch_alertmanager_queue_length") == 0


async def test_two_kvwatch_instances_posting_the_same_alert_yield_one_alert(
    alertmanager: AlertmanagerProcess, webhook: RecordingServer
) -> None:
    """Two replicas, same labels: Alertmanager holds one alert and pages once."""
    state = firing(now())
    first, _ = delivery([alertmanager.url], Outbox(state), Clock())
    second, _ = delivery([alertmanager.url], Outbox(state), Clock())
    await asyncio.gather(first.send_due(), second.send_due())
    await first.aclose()
    await second.aclose()
    assert len(alertmanager.alerts()) == 1
    await wait_for(lambda: len(webhook_alerts(webhook)) >= 1, "a page")
    await asyncio.sleep(1.5)  # a group interval: a duplicate would have shown by now
    assert len(webhook_alerts(webhook)) == 1


async def test_an_alert_alertmanager_rejects_is_counted_and_dropped(
    alertmanager: AlertmanagerProcess,
) -> None:
    """A label name Alertmanager refuses: 400, one error, one drop, and nothing held."""
    bad = firing(now(), **{"bad-name": "x"})
    sender, registry = delivery([alertmanager.url], Outbox(bad), Clock())
    await sender.send_due()
    await sender.send_due()
    await sender.aclose()
    am = f"{alertmanager.url}/api/v2/alerts"
    assert notifications(registry, "errors", am) == 1
    assert notifications(registry, "dropped", am) == 1
    assert notifications(registry, "sent", am) == 0
    assert alertmanager.alerts() == []
