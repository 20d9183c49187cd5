"""Served-window measurements and bisect probes in the store (migration 0007), both databases."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta

from sqlalchemy import MetaData, insert, text

from kvwatch.canary.markers import canonical
from kvwatch.store import NewProbe, ProbeOutcome
from kvwatch.store.engine import create_engine_for
from kvwatch.store.migrate import upgrade_engine
from kvwatch.store.records import ServedWindowRecord
from tests.helpers.store import Store, get_probe
from tests.store.conftest import insert_old_rows

NewProbeFactory = Callable[..., NewProbe]
T0 = datetime(2026, 12, 3, 5, 0, tzinfo=UTC)


def _window(endpoint: str, served: int, minute: int, **kw: object) -> ServedWindowRecord:
    base = ServedWindowRecord(
        endpoint=endpoint,
        measured_at=T0 + timedelta(minutes=minute),
        source="search",
        advertised_tokens=1_048_576,
        served_tokens=served,
        unserved_tokens=served + 1,
        exact=True,
        probes=2,
        prompt_tokens=2 * served + 1,
        probe_id=None,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def _done(store: Store, probe: NewProbe, verdict: str) -> int:
    probe_id = store.begin_probe(probe)
    store.finish_probe(
        probe_id, ProbeOutcome(verdict=verdict, reason=verdict, finished_at=probe.started_at)
    )
    return probe_id


def test_the_latest_measurement_of_each_endpoint_is_its_served_window(store: Store) -> None:
    """served_windows() returns one row per endpoint: the newest, by endpoint or for all."""
    store.record_served_window(_window("a", 681_280, 0))
    store.record_served_window(_window("b", 4_096, 1))
    store.record_served_window(
        _window("a", 1_048_576, 2, source="recovered", unserved_tokens=None, probes=0)
    )
    every = store.served_windows()
    assert {k: (v.source, v.served_tokens) for k, v in every.items()} == {
        "a": ("recovered", 1_048_576),
        "b": ("search", 4_096),
    }
    assert store.served_windows("b") == {"b": _window("b", 4_096, 1)}
    assert store.served_windows("nobody") == {}


def test_a_bisect_probe_keeps_its_trigger_and_the_search_starts_at_the_last_pass(
    store: Store, new_probe: NewProbeFactory
) -> None:
    """trigger_probe_id round-trips; last_passing_size is the newest pass below the failure."""
    base = _done(store, new_probe(kind="baseline", planned_prompt_tokens=1_536), "pass")
    trigger = _done(store, new_probe(planned_prompt_tokens=1_048_544), "truncated")
    step = _done(
        store,
        new_probe(kind="bisect", planned_prompt_tokens=681_280, trigger_probe_id=trigger),
        "pass",
    )
    row = get_probe(store, step)
    assert row is not None and (row.kind, row.trigger_probe_id) == ("bisect", trigger)
    assert store.last_passing_size("glm-prod", ["baseline"], below=1_048_544) == 1_536
    assert store.last_passing_size("glm-prod", ["baseline"], below=1_536) is None
    assert base < trigger


def test_upgrading_to_0007_keeps_markers_and_links_to_probes(db_url: str) -> None:
    """Adding the trigger link rebuilds probes on SQLite: no marker, confirmation or claim
    that points at a probe may be lost or unlinked by it."""
    engine = create_engine_for(db_url)
    try:
        upgrade_engine(engine, "0005")
        tables = MetaData()
        tables.reflect(engine)
        with engine.begin() as c:
            insert_old_rows(
                c,
                tables,
                {"id": 7, "verdict": "truncated"},
                {
                    "id": 8,
                    "verdict": "truncated",
                    "marker": "KVW-AAAA-BBBB-CCCD",
                    "confirms_probe_id": 7,
                },
                at=T0,
            )
            for probe_id, marker in ((7, "KVW-AAAA-BBBB-CCCC"), (8, "KVW-AAAA-BBBB-CCCD")):
                c.execute(
                    insert(tables.tables["markers"]).values(
                        marker=canonical(marker), probe_id=probe_id, endpoint="ep", issued_at=T0
                    )
                )
            c.execute(
                insert(tables.tables["probe_slots"]).values(
                    endpoint="ep",
                    kind="under",
                    slot=1000,
                    region="",
                    replica="kvwatch-0",
                    claimed_at=T0,
                    expires_at=T0,
                    attempts=1,
                    done=True,
                    probe_id=8,
                )
            )
        upgrade_engine(engine)
        store = Store(engine)
        assert set(store.lookup_markers([canonical("KVW-AAAA-BBBB-CCCC")])) == {
            canonical("KVW-AAAA-BBBB-CCCC")
        }
        row = get_probe(store, 8)
        assert row is not None and (row.confirms_probe_id, row.trigger_probe_id) == (7, None)
        with engine.connect() as c:
            assert c.execute(text("SELECT count(*) FROM markers")).scalar() == 2
            assert c.execute(text("SELECT probe_id FROM probe_slots")).scalar() == 8
    finally:
        engine.dispose()
