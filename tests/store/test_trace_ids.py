"""probes.trace_id: written with the probe's start, read back, and added by migration 0010
without touching older rows."""

from __future__ import annotations

from sqlalchemy import MetaData, inspect, select

from kvwatch.store import create_engine_for
from kvwatch.store.migrate import downgrade_engine, upgrade_engine
from kvwatch.store.models import Marker
from tests.helpers.store import Store, get_probe
from tests.store.conftest import NewProbeFactory, insert_old_rows, outcome

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"


def test_the_trace_id_is_stored_at_the_start_and_kept_when_the_probe_finishes(
    store: Store, new_probe: NewProbeFactory
) -> None:
    """A running probe already has its trace id (a crash still links to the engine's spans);
    finishing it changes nothing; a probe sent with tracing off has none."""
    traced = store.begin_probe(new_probe(trace_id=TRACE_ID))
    running = get_probe(store, traced)
    assert running is not None and running.trace_id == TRACE_ID
    store.finish_probe(traced, outcome())
    finished = get_probe(store, traced)
    assert finished is not None and finished.trace_id == TRACE_ID
    untraced = get_probe(store, store.begin_probe(new_probe()))
    assert untraced is not None and untraced.trace_id is None


def test_migration_0010_leaves_old_probes_without_a_trace_id_and_drops_it_back(
    db_url: str,
) -> None:
    """A probe stored at 0009 reads back with trace_id None after 0010 (and every later
    revision: the store reads the newest schema); downgrading to 0009 removes the column and
    keeps the probe and its issued marker."""
    engine = create_engine_for(db_url)
    try:
        upgrade_engine(engine, "0009")
        tables = MetaData()
        tables.reflect(engine)
        with engine.begin() as c:
            insert_old_rows(c, tables, {"id": 7})
            c.execute(
                tables.tables["markers"]
                .insert()
                .values(
                    marker="AAAABBBBCCCC",
                    probe_id=7,
                    endpoint="ep",
                    issued_at=c.execute(select(tables.tables["probes"].c.started_at)).scalar_one(),
                )
            )
        upgrade_engine(engine, "head")
        row = get_probe(Store(engine), 7)
        assert row is not None and row.trace_id is None and row.verdict == "pass"
        downgrade_engine(engine, "0009")
        columns = {c["name"] for c in inspect(engine).get_columns("probes")}
        assert "trace_id" not in columns and "tenant" in columns
        with engine.connect() as c:
            assert c.execute(select(Marker.probe_id)).scalars().all() == [7]
            assert c.execute(select(tables.tables["probes"].c.id)).scalars().all() == [7]
    finally:
        engine.dispose()
