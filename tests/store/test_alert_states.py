"""Alert states persist, and change only together with the probe result that caused them."""

from __future__ import annotations

import collections
import gc
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kvwatch.canary.model import ProbeState
from kvwatch.store import AlertStateRecord, NewProbe, ProbeOutcome, StoreError
from tests.helpers.store import Store, get_probe

NewProbeFactory = Callable[..., NewProbe]
OutcomeFactory = Callable[..., ProbeOutcome]

STARTS = datetime(2026, 3, 1, 12, 0, 42, tzinfo=UTC)


def firing(last_probe_id: int | None, **changes: Any) -> AlertStateRecord:
    """A firing leak alert for glm-prod/under; keyword arguments override fields."""
    record = AlertStateRecord(
        alertname="KVWatchCrossRequestLeak",
        endpoint="glm-prod",
        probe="under",
        state="firing",
        severity="critical",
        updated_at=STARTS,
        failures=2,
        passes=0,
        starts_at=STARTS,
        last_probe_id=last_probe_id,
        labels={"alertname": "KVWatchCrossRequestLeak", "endpoint": "glm-prod", "probe": "under"},
        annotations={"summary": "a marker leaked", "runbook_url": "https://runbooks/leak"},
        generator_url="http://kvwatch:9464/probes/1",
    )
    return replace(record, **changes)


def test_a_finished_probe_and_its_alert_state_are_written_together(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory
) -> None:
    """finish_probe stores the alert states passed with the result, exactly as given."""
    probe_id = store.begin_probe(new_probe())
    record = firing(probe_id)
    store.finish_probe(probe_id, make_outcome("foreign_marker"), [record])
    assert store.load_alert_states() == [record]


def test_a_failed_alert_write_leaves_the_probe_running(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory
) -> None:
    """When the alert upsert violates a constraint, the verdict is not written either."""
    probe_id = store.begin_probe(new_probe())
    # last_probe_id must reference a stored probe: this one does not exist.
    broken = firing(probe_id + 1000)
    with pytest.raises(StoreError, match=f"could not finish probe {probe_id}"):
        store.finish_probe(probe_id, make_outcome("foreign_marker"), [broken])
    row = get_probe(store, probe_id)
    assert row is not None
    assert (row.state, row.verdict, row.finished_at) == (ProbeState.RUNNING, None, None)
    assert store.load_alert_states() == []
    # And the probe can still be finished properly afterwards.
    store.finish_probe(probe_id, make_outcome("foreign_marker"), [firing(probe_id)])
    assert store.load_alert_states() == [firing(probe_id)]


def test_saving_an_alert_state_again_updates_it_in_place(
    store: Store, new_probe: NewProbeFactory
) -> None:
    """save_alert_states upserts by (alertname, endpoint, probe) and keeps other rows."""
    probe_id = store.begin_probe(new_probe())
    other = firing(None, alertname="KVWatchProbeFailing", probe="", severity="warning")
    store.save_alert_states([firing(probe_id), other])
    resolved = firing(
        probe_id,
        state="resolved",
        failures=0,
        passes=3,
        ends_at=STARTS + timedelta(minutes=30),
        updated_at=STARTS + timedelta(minutes=30),
        annotations={"summary": "resolved"},
        generator_url=None,
    )
    store.save_alert_states([resolved])
    assert store.load_alert_states() == [resolved, other]


def test_the_last_record_for_a_key_wins_within_one_save(store: Store) -> None:
    """Two records for one alert in one call store the later one (no duplicate-key error)."""
    first = firing(None, failures=1, state="pending")
    second = firing(None, failures=2)
    store.save_alert_states([first, second])
    assert store.load_alert_states() == [second]


def test_an_unknown_alert_state_is_refused(store: Store) -> None:
    """The state column only holds inactive, pending, firing or resolved."""
    with pytest.raises(StoreError, match="could not save alert states"):
        store.save_alert_states([firing(None, state="exploded")])
    assert store.load_alert_states() == []


def test_finishing_a_probe_with_its_alert_state_leaves_nothing_to_the_cyclic_collector(
    store: Store, new_probe: NewProbeFactory, make_outcome: OutcomeFactory
) -> None:
    """The write every probe makes is freed by reference counting (issue 25): built per call,
    the alert upsert's ``excluded`` alias left its copied columns in reference cycles."""
    for _ in range(2):  # first use: statements compiled and cached, sessions pooled
        probe_id = store.begin_probe(new_probe())
        store.finish_probe(probe_id, make_outcome("foreign_marker"), [firing(probe_id)])
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        probe_id = store.begin_probe(new_probe())
        store.finish_probe(probe_id, make_outcome("foreign_marker"), [firing(probe_id)])
        gc.collect()
        left = collections.Counter(type(o).__qualname__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert left == {}
