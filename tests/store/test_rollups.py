"""Hourly rollups stay equal to what the probes say: on finish, record, prune and upgrade."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select

from kvwatch.store import NewProbe, ProbeOutcome
from kvwatch.store.migrate import downgrade_engine, upgrade_engine
from kvwatch.store.models import ProbeRollup
from kvwatch.store.queries import HistoryQueries
from kvwatch.store.rollups import rebuild
from tests.helpers.store import Store

NewProbeFactory = Callable[..., NewProbe]
OutcomeFactory = Callable[..., ProbeOutcome]

# Durations whose shortest text needs all 17 digits, or that 15 digits would round.
AWKWARD = (0.1 + 0.2, 1.2345678901234567, 41.25, 2.0 / 3.0, 1e-7)


def _rollups(store: Store) -> dict[tuple[str, int, str], dict[str, Any]]:
    with store.engine.connect() as c:
        rows = c.execute(select(ProbeRollup)).all()
    table: dict[tuple[str, int, str], dict[str, Any]] = {}
    for r in rows:
        values = r._asdict()
        # The order of durations within an hour is the order probes finished in.
        values["durations"] = sorted(float(d) for d in values["durations"].split())
        table[(r.endpoint, r.hour, r.verdict)] = values
    return table


def _rebuilt(store: Store) -> dict[tuple[str, int, str], dict[str, Any]]:
    with store.engine.begin() as c:
        rebuild(c)
    return _rollups(store)


def _percentile(ordered: list[float], q: float) -> float:
    # As PostgreSQL's percentile_cont: linear between the two nearest ranks.
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _history(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory, t0: datetime
) -> None:
    """Probes over three hours, two endpoints, several verdicts, every write path."""
    for n, duration in enumerate(AWKWARD):
        started = t0 + timedelta(minutes=25 * n)
        kind = "under" if n % 2 == 0 else "over"
        probe = new_probe(started_at=started, kind=kind, endpoint=f"ep-{n % 2}")
        verdict = "pass" if n != 1 else "truncated"
        outcome = make_outcome(verdict, duration_seconds=duration, reported_prompt_tokens=1000 + n)
        if n == 4:
            store.record_probe(probe, outcome)  # written whole after a database outage
        else:
            store.finish_probe(store.begin_probe(probe), outcome)
    untimed = new_probe(started_at=t0 + timedelta(minutes=5))
    store.finish_probe(store.begin_probe(untimed), make_outcome("error", duration_seconds=None))
    store.begin_probe(new_probe(started_at=t0 + timedelta(minutes=6)))  # still running


def test_finishing_and_recording_probes_keeps_rollups_equal_to_a_rebuild(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory, t0: datetime
) -> None:
    """Rollups bumped on every finish equal the rollups recomputed from the probes."""
    _history(store, new_probe, make_outcome, t0)
    bumped = _rollups(store)
    assert sum(r["probes"] for r in bumped.values()) == len(AWKWARD) + 1
    assert bumped == _rebuilt(store)


def test_durations_survive_the_rollup_exactly(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory, t0: datetime
) -> None:
    """Every stored double reads back bit for bit, whichever path wrote it."""
    _history(store, new_probe, make_outcome, t0)
    for table in (_rollups(store), _rebuilt(store)):
        durations = sorted(d for r in table.values() for d in r["durations"])
        assert durations == sorted(AWKWARD)


def test_pruning_recomputes_the_hours_it_touched(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory, t0: datetime
) -> None:
    """After a prune that keeps some verdicts, the rollups still match the probes left."""
    _history(store, new_probe, make_outcome, t0)
    pruned = store.prune(t0 + timedelta(minutes=60), keep_verdicts=["truncated"], batch=2)
    assert pruned == 3  # the first hour's probes but the truncated one and the running one
    remaining = _rollups(store)
    assert remaining == _rebuilt(store)
    assert sum(r["probes"] for r in remaining.values()) == 3


def test_upgrading_an_existing_history_fills_the_rollups(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory, t0: datetime
) -> None:
    """Migration 0004 computes the rollups of probes stored before it."""
    _history(store, new_probe, make_outcome, t0)
    expected = _rollups(store)
    downgrade_engine(store.engine, "0003")
    upgrade_engine(store.engine)
    assert _rollups(store) == expected


def test_summary_over_ragged_hours_matches_the_probes(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory, t0: datetime
) -> None:
    """A window starting and ending mid-hour counts exactly the probes inside it."""
    durations = []
    for minute in range(0, 300, 7):
        duration = 1 + (minute * 37 % 101) / 7
        probe = new_probe(started_at=t0 + timedelta(minutes=minute))
        verdict = "pass" if minute % 3 else "marker_missing"
        store.finish_probe(
            store.begin_probe(probe), make_outcome(verdict, duration_seconds=duration)
        )
        durations.append((minute, verdict, duration))
    since, until = t0 + timedelta(minutes=50), t0 + timedelta(minutes=250)
    inside = [(v, d) for m, v, d in durations if 50 <= m < 250]
    summary = HistoryQueries(store).summary("glm-prod", since, until)
    assert summary.finished == len(inside)
    assert summary.verdicts == {
        "marker_missing": sum(v == "marker_missing" for v, _ in inside),
        "pass": sum(v == "pass" for v, _ in inside),
    }
    ordered = sorted(d for _, d in inside)
    assert summary.p50_duration_seconds == _percentile(ordered, 0.50)
    assert summary.p95_duration_seconds == _percentile(ordered, 0.95)


def test_a_long_timeline_is_cut_on_whole_hours(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory, t0: datetime
) -> None:
    """A 7-day chart has 2-hour slices from the hour before its start, counting every probe."""
    until = t0 + timedelta(days=7)
    starts = [t0 - timedelta(minutes=1), t0 + timedelta(minutes=1), until - timedelta(seconds=1)]
    starts += [t0 + timedelta(hours=h, minutes=30) for h in range(0, 168, 5)]
    for n, started in enumerate(starts):
        probe = new_probe(started_at=started, kind="under")
        outcome = make_outcome("pass", duration_seconds=float(n + 1))
        store.finish_probe(store.begin_probe(probe), outcome)
    chart = HistoryQueries(store).timeline("glm-prod", t0, until, 120)
    assert chart.width_seconds == 7200
    assert chart.start == t0.replace(minute=0, second=0, microsecond=0)
    assert chart.count == 85  # 168 hours from t0's hour, plus the part of one more
    assert sum(b.verdicts["pass"] for b in chart.buckets) == len(starts) - 1
    last = chart.buckets[-1]
    assert last.index == 83 and last.max_duration_seconds == 3.0  # the probe at until - 1 s
    assert all(b.start == chart.start + timedelta(hours=2 * b.index) for b in chart.buckets)


def test_a_short_timeline_keeps_its_exact_slices(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory, t0: datetime
) -> None:
    """Slices under an hour split the window exactly, as before rollups existed."""
    probe = replace(new_probe(), started_at=t0 + timedelta(minutes=30))
    store.finish_probe(store.begin_probe(probe), make_outcome("pass"))
    chart = HistoryQueries(store).timeline("glm-prod", t0, t0 + timedelta(hours=24), 120)
    assert (chart.start, chart.width_seconds, chart.count) == (t0, 720, 120)
    assert [(b.index, b.verdicts) for b in chart.buckets] == [(2, {"pass": 1})]


def test_a_short_timeline_of_an_uneven_span_ends_at_its_until(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory, t0: datetime
) -> None:
    """10.5 minutes in 120 slices: 6-second slices, only as many as reach until (105)."""
    until = t0 + timedelta(seconds=630)
    probe = replace(new_probe(), started_at=until - timedelta(seconds=1))
    store.finish_probe(store.begin_probe(probe), make_outcome("pass"))
    chart = HistoryQueries(store).timeline("glm-prod", t0, until, 120)
    assert (chart.width_seconds, chart.count) == (6, 105)
    assert [b.index for b in chart.buckets] == [104]
