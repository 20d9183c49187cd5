"""Exactly what kvwatch POSTs, and when: frozen time against a recording receiver."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry
from structlog.testing import capture_logs

from kvwatch import __version__
from kvwatch.alerting.alertmanager import AlertmanagerSettings
from kvwatch.alerting.delivery import Delivery
from kvwatch.alerting.state import AlertState, AlertStatus
from tests.alerting.delivery_scaffold import (
    FROZEN,
    Clock,
    Outbox,
    delivery,
    firing,
    notifications,
    resolved,
    sample,
)
from tests.helpers.alertmanager import RecordingServer, free_port, wait_until

EXPECTED_LABELS = {
    "alertname": "KVWatchContextNotHonored",
    "endpoint": "glm-prod",
    "model": "glm-5.3",
    "probe": "under",
    "severity": "critical",
}
EXPECTED_ANNOTATIONS = {
    "description": "The under probe 42 ended in verdict marker_missing.",
    "runbook_url": "https://runbooks.example/kvwatch#kvwatchcontextnothonored",
    "summary": "glm-prod accepted the under canary but did not attend to all of it",
}


async def test_a_firing_alert_is_posted_with_stable_start_and_end_four_resends_ahead(
    recorder: RecordingServer,
) -> None:
    """Firing: POST /api/v2/alerts, startsAt as stored, endsAt = now + 4 x resend interval."""
    clock = Clock(FROZEN)
    sender, _ = delivery([recorder.url], Outbox(firing(FROZEN)), clock)
    clock.advance(5)
    await sender.send_due()
    await sender.aclose()
    [request] = recorder.requests
    assert request.path == "/api/v2/alerts"
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["User-Agent"] == f"kvwatch/{__version__}"
    assert request.body == [
        {
            "labels": EXPECTED_LABELS,
            "annotations": EXPECTED_ANNOTATIONS,
            "startsAt": "2025-03-01T12:00:00.123Z",
            "endsAt": "2025-03-01T12:04:05.123Z",
            "generatorURL": "http://kvwatch.example:9464/probes/42",
        }
    ]


async def test_a_resolved_alert_is_posted_with_its_resolution_time_as_end(
    recorder: RecordingServer,
) -> None:
    """Resolved: endsAt is the resolution time, not a time in the future."""
    clock = Clock(FROZEN)
    resolved_at = FROZEN.replace(minute=30)
    outbox = Outbox(resolved(firing(FROZEN), resolved_at))
    clock.now = resolved_at.replace(second=10)
    sender, _ = delivery([recorder.url], outbox, clock)
    await sender.send_due()
    await sender.aclose()
    assert recorder.bodies() == [
        [
            {
                "labels": EXPECTED_LABELS,
                "annotations": EXPECTED_ANNOTATIONS,
                "startsAt": "2025-03-01T12:00:00.123Z",
                "endsAt": "2025-03-01T12:30:00.123Z",
                "generatorURL": "http://kvwatch.example:9464/probes/42",
            }
        ]
    ]


async def test_a_firing_alert_is_resent_every_resend_interval_and_not_between(
    recorder: RecordingServer,
) -> None:
    """Nothing is re-sent before the resend interval; at it, startsAt holds and endsAt moves."""
    clock = Clock(FROZEN)
    sender, _ = delivery([recorder.url], Outbox(firing(FROZEN)), clock, resend_interval=60)
    next_due = await sender.send_due()
    assert next_due == FROZEN.replace(minute=1)
    clock.advance(59)
    await sender.send_due()
    assert len(recorder.requests) == 1
    clock.advance(1)
    await sender.send_due()
    await sender.aclose()
    first, second = recorder.bodies()
    assert second[0]["startsAt"] == first[0]["startsAt"] == "2025-03-01T12:00:00.123Z"
    assert second[0]["endsAt"] == "2025-03-01T12:05:00.123Z"


async def test_a_changed_alert_is_sent_at_once_within_the_resend_interval(
    recorder: RecordingServer,
) -> None:
    """A resolution does not wait for the next resend."""
    clock = Clock(FROZEN)
    outbox = Outbox(firing(FROZEN))
    sender, _ = delivery([recorder.url], outbox, clock)
    await sender.send_due()
    clock.advance(10)
    outbox.put(resolved(firing(FROZEN), clock.now))
    await sender.send_due()
    await sender.aclose()
    assert len(recorder.requests) == 2
    assert recorder.bodies()[1][0]["endsAt"] == "2025-03-01T12:00:10.123Z"


async def test_a_resolved_alert_is_resent_for_fifteen_minutes_then_no_more(
    recorder: RecordingServer,
) -> None:
    """Resolved alerts go out every resend interval until 15 minutes after resolution."""
    clock = Clock(FROZEN)
    sender, _ = delivery([recorder.url], Outbox(resolved(firing(FROZEN), FROZEN)), clock)
    for _ in range(16):
        await sender.send_due()
        clock.advance(60)
    await sender.send_due()
    await sender.aclose()
    # Sent at +0, +1 min ... +15 min inclusive: sixteen sends, none at +16 min.
    assert len(recorder.requests) == 16


async def test_pending_and_inactive_alerts_are_never_sent(recorder: RecordingServer) -> None:
    """Only firing and recently resolved alerts reach Alertmanager."""
    clock = Clock(FROZEN)
    base = firing(FROZEN)
    outbox = Outbox(
        dataclasses.replace(base, state=AlertStatus.PENDING, starts_at=None),
        dataclasses.replace(base, endpoint="other", state=AlertStatus.INACTIVE, starts_at=None),
    )
    sender, _ = delivery([recorder.url], outbox, clock)
    await sender.send_due()
    await sender.aclose()
    assert recorder.requests == []


async def test_every_configured_alertmanager_receives_every_alert() -> None:
    """An HA pair: both members get the same alerts."""
    with RecordingServer() as first, RecordingServer() as second:
        clock = Clock(FROZEN)
        outbox = Outbox(firing(FROZEN), firing(FROZEN, endpoint="other"))
        sender, registry = delivery([first.url, second.url], outbox, clock)
        await sender.send_due()
        await sender.aclose()
        assert first.bodies() == second.bodies()
        assert len(first.bodies()[0]) == 2
        for url in (first.url, second.url):
            am = f"{url}/api/v2/alerts"
            assert notifications(registry, "sent", am) == 2


async def test_a_5xx_is_counted_and_retried_after_the_retry_interval(
    recorder: RecordingServer,
) -> None:
    """5xx: errors counted, nothing dropped, queue holds it, retried once retry_interval passed."""
    recorder.status = 503
    clock = Clock(FROZEN)
    sender, registry = delivery([recorder.url], Outbox(firing(FROZEN)), clock, retry_interval=10)
    am = f"{recorder.url}/api/v2/alerts"
    await sender.send_due()
    assert notifications(registry, "errors", am) == 1
    assert notifications(registry, "dropped", am) == 0
    assert sample(registry, "kvwatch_alertmanager_queue_length") == 1
    clock.advance(5)
    await sender.send_due()
    assert len(recorder.requests) == 1
    recorder.status = 200
    clock.advance(5)
    await sender.send_due()
    await sender.aclose()
    assert len(recorder.requests) == 2
    assert notifications(registry, "sent", am) == 1
    assert sample(registry, "kvwatch_alertmanager_queue_length") == 0


async def test_a_4xx_is_counted_dropped_and_not_retried(recorder: RecordingServer) -> None:
    """4xx: an error and a drop; the same payload is not sent again before its next resend."""
    recorder.status = 400
    clock = Clock(FROZEN)
    sender, registry = delivery([recorder.url], Outbox(firing(FROZEN)), clock)
    am = f"{recorder.url}/api/v2/alerts"
    with capture_logs() as logs:
        await sender.send_due()
    clock.advance(30)
    await sender.send_due()
    await sender.aclose()
    assert len(recorder.requests) == 1
    assert notifications(registry, "errors", am) == 1
    assert notifications(registry, "dropped", am) == 1
    assert sample(registry, "kvwatch_alertmanager_queue_length") == 0
    assert [e["log_level"] for e in logs] == ["error"]


async def test_a_network_error_is_counted_and_logged_without_credentials() -> None:
    """No listener: an error per alert, and neither the password nor the token is logged."""
    url = f"http://kvwatch:s3cret-pass@127.0.0.1:{free_port()}"
    clock = Clock(FROZEN)
    sender, registry = delivery([url], Outbox(firing(FROZEN)), clock)
    with capture_logs() as logs:
        await sender.send_due()
    await sender.aclose()
    am = f"http://127.0.0.1:{url.rsplit(':', 1)[1]}/api/v2/alerts"
    assert sender.alertmanagers == [am]
    assert notifications(registry, "errors", am) == 1
    assert logs and "s3cret" not in repr(logs)


async def test_basic_auth_and_bearer_token_are_sent(recorder: RecordingServer) -> None:
    """The configured credentials reach the Alertmanager in the Authorization header."""
    clock = Clock(FROZEN)
    outbox = Outbox(firing(FROZEN))
    basic, _ = delivery([recorder.url], outbox, clock, username="kv", password="pw")
    bearer, _ = delivery([recorder.url], outbox, clock, bearer_token="tok")
    await basic.send_due()
    await bearer.send_due()
    await basic.aclose()
    await bearer.aclose()
    assert [r.headers["Authorization"] for r in recorder.requests] == [
        "Basic a3Y6cHc=",
        "Bearer tok",
    ]


async def test_the_firing_gauge_counts_firing_alerts_per_alertname(
    recorder: RecordingServer,
) -> None:
    """kvwatch_alerts_firing: firing alerts per name, zero for the quiet ones."""
    clock = Clock(FROZEN)
    outbox = Outbox(
        firing(FROZEN),
        firing(FROZEN, endpoint="b"),
        resolved(firing(FROZEN, endpoint="c"), FROZEN),
    )
    sender, registry = delivery([recorder.url], outbox, clock)
    await sender.send_due()
    await sender.aclose()
    assert sample(registry, "kvwatch_alerts_firing", alertname="KVWatchContextNotHonored") == 2
    assert (
        registry.get_sample_value("kvwatch_alerts_firing", {"alertname": "KVWatchCrossRequestLeak"})
        == 0
    )


async def test_notify_wakes_the_loop_at_once(recorder: RecordingServer) -> None:
    """run() sleeps until the next resend, but notify() sends a new state right away."""
    outbox = Outbox()
    sender, _ = delivery([recorder.url], outbox, Clock(), resend_interval=3600)
    task = asyncio.create_task(sender.run())
    try:
        await asyncio.sleep(0.2)
        outbox.put(firing(FROZEN))
        began = time.monotonic()
        sender.notify()
        await asyncio.to_thread(wait_until, lambda: len(recorder.requests) == 1, 5, "a POST")
        assert time.monotonic() - began < 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sender.aclose()


async def test_the_loop_survives_a_failing_outbox(recorder: RecordingServer) -> None:
    """A store that raises is logged; the loop keeps running and delivers once it recovers."""
    outbox = Outbox(firing(FROZEN))
    calls = 0

    async def flaky() -> Sequence[AlertState]:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("database is down")
        return list(await outbox.load())

    sender = Delivery(
        settings=AlertmanagerSettings(urls=(recorder.url,)),
        load_states=flaky,
        registry=CollectorRegistry(),
    )
    task = asyncio.create_task(sender.run())
    try:
        await asyncio.sleep(0.1)
        sender.notify()
        await asyncio.to_thread(wait_until, lambda: len(recorder.requests) == 1, 5, "a POST")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sender.aclose()
