"""A removed endpoint's alert states: resolved at once, forgotten once re-sent long enough."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from types import SimpleNamespace

from kvwatch.alerting.evaluator import RESOLVED_REASON, AlertEvaluator
from kvwatch.alerting.policy import default_policy
from kvwatch.alerting.state import AlertStatus, evaluate
from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.config import parse_config
from kvwatch.daemon import _idle_then_forget
from kvwatch.probe.model import ProbeReport, Target
from kvwatch.store.records import AlertStateRecord
from tests.alerting.test_cross_tenant_alert import T0, leak_event


class Clock:
    def __init__(self) -> None:
        self.now = T0 + timedelta(hours=1)

    def __call__(self):  # type: ignore[no-untyped-def]
        return self.now


def firing_records() -> list[AlertStateRecord]:
    states: dict = {}
    now = T0
    for event in (leak_event(41), leak_event(42, confirmation=True)):
        now += timedelta(minutes=1)
        for state in evaluate(states, event, default_policy(), now):
            states[state.key] = state
    assert [s.state for s in states.values()] == [AlertStatus.FIRING]
    return [AlertStateRecord(**dataclasses.asdict(s)) for s in states.values()]


def evaluator(clock: Clock) -> AlertEvaluator:
    return AlertEvaluator(
        policy=default_policy(),
        states=firing_records(),
        probe_url=str,
        clock=clock,
        keep_retired=timedelta(minutes=15),
    )


def test_a_retired_endpoints_states_are_forgotten_after_their_resolution_was_kept() -> None:
    """Retiring resolves the firing alert; delivery still sees it for 15 minutes, then the
    evaluator holds no state for the endpoint."""
    clock = Clock()
    alerts = evaluator(clock)
    alerts.committed(alerts.retire("glm-prod", "the endpoint was removed from the configuration"))
    assert [r.state for r in alerts.records()] == ["resolved"]
    clock.now += timedelta(minutes=14)
    assert len(alerts.records()) == 1
    clock.now += timedelta(minutes=2)
    assert alerts.records() == [] and alerts.state_count == 0


def test_an_endpoint_configured_again_keeps_its_states() -> None:
    """Revived before the retention ends, the endpoint's states stay past it."""
    clock = Clock()
    alerts = evaluator(clock)
    alerts.committed(alerts.retire("glm-prod", "the endpoint was removed from the configuration"))
    alerts.revive("glm-prod")
    clock.now += timedelta(hours=1)
    assert len(alerts.records()) == 1


def _failed_under(endpoint: str) -> ProbeReport:
    return ProbeReport(
        probe_id=43,
        endpoint=endpoint,
        kind=ProbeKind.UNDER,
        verdict=Verdict.TRUNCATED,
        reason="engine read 2048 of 4000 prompt tokens",
        status=200,
        planned_prompt_tokens=4000,
        reported_prompt_tokens=2048,
        marker="KVW-1111-1111-1111",
        marker_found=False,
        foreign=(),
        duration_seconds=1.0,
        confirms_probe_id=None,
        finished_at=T0 + timedelta(hours=1),
    )


def _target(name: str) -> Target:
    entry = {"name": name, "url": "http://x/v1", "model": "m", "confirm": False}
    [spec] = parse_config(
        "endpoints: [" + repr(entry).replace("'", '"').replace("False", "false") + "]",
        source="<test>",
    ).resolved_endpoints()
    return Target(spec=spec, endpoint_id=1, engine=None, counter=None)  # type: ignore[arg-type]


def test_a_probe_finishing_after_its_endpoint_was_retired_fires_nothing() -> None:
    """The in-flight probe's failure is not judged: the retired alert stays resolved."""
    clock = Clock()
    alerts = evaluator(clock)
    alerts.committed(alerts.retire("glm-prod", "the endpoint was removed from the configuration"))
    assert alerts.evaluate(_failed_under("glm-prod"), _target("glm-prod")) == []
    assert [r.state for r in alerts.records()] == ["resolved"]


def test_a_revived_endpoints_failures_are_judged_again() -> None:
    """Configured again, the same failure opens an alert."""
    clock = Clock()
    alerts = evaluator(clock)
    alerts.committed(alerts.retire("glm-prod", "the endpoint was removed from the configuration"))
    alerts.revive("glm-prod")
    changed = alerts.evaluate(_failed_under("glm-prod"), _target("glm-prod"))
    assert [(c.alertname, c.state) for c in changed] == [("KVWatchContextNotHonored", "firing")]


def test_a_probe_judged_before_the_removal_and_stored_after_it_reopens_nothing() -> None:
    """A failure judged just before retire() and committed after it is refused: delivery
    keeps the resolution, and corrections() gives the rows to write over the late ones
    (resolved as retire left it, inactive for an alert the late probe opened), once."""
    clock = Clock()
    alerts = evaluator(clock)
    [leak] = firing_records()
    late = [
        dataclasses.replace(leak, failures=leak.failures + 1, updated_at=clock.now),
        *alerts.evaluate(_failed_under("glm-prod"), _target("glm-prod")),
    ]
    assert [(r.alertname, r.state) for r in late][1] == ("KVWatchContextNotHonored", "firing")
    alerts.committed(alerts.retire("glm-prod", "the endpoint was removed from the configuration"))
    alerts.committed(late)
    assert [(r.alertname, r.state) for r in alerts.records()] == [(leak.alertname, "resolved")]
    fixes = {r.alertname: r for r in alerts.corrections("glm-prod")}
    assert fixes[leak.alertname].state == "resolved"
    assert fixes[leak.alertname].annotations[RESOLVED_REASON].startswith("the endpoint was")
    assert fixes["KVWatchContextNotHonored"].state == "inactive"
    assert alerts.corrections("glm-prod") == []


class _Scheduler:
    """The two calls _idle_then_forget makes: the endpoint's last probe ends on ``ended``."""

    def __init__(self) -> None:
        self.ended = asyncio.Event()

    async def idle(self, endpoint: str) -> None:
        await self.ended.wait()

    def schedules(self, endpoint: str) -> bool:
        return False


async def test_the_late_rows_are_written_over_once_the_endpoints_last_probe_ended() -> None:
    """The daemon saves the corrections after the probe in flight has stored its own rows,
    never before (they would be overwritten again)."""
    clock = Clock()
    alerts = evaluator(clock)
    late = alerts.evaluate(_failed_under("glm-prod"), _target("glm-prod"))
    alerts.committed(alerts.retire("glm-prod", "the endpoint was removed from the configuration"))
    saved: list[list[AlertStateRecord]] = []
    built = SimpleNamespace(
        alerts=alerts,
        store=SimpleNamespace(save_alert_states=saved.append),
        metrics=SimpleNamespace(forget_endpoint=lambda *args: None),
    )
    scheduler = _Scheduler()
    spec = _target("glm-prod").spec
    waiting = asyncio.create_task(_idle_then_forget(built, scheduler, spec))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    alerts.committed(late)  # the probe in flight stores its result
    assert saved == []
    scheduler.ended.set()
    await waiting
    assert [[(r.alertname, r.state) for r in rows] for rows in saved] == [
        [("KVWatchContextNotHonored", "inactive")]
    ]
