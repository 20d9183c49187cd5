"""A several-depth probe stores every marker and, per depth, what became of it."""

from __future__ import annotations

from sqlalchemy import MetaData, inspect, select

from kvwatch.canary.markers import canonical, new_marker
from kvwatch.canary.model import DepthOutcome, DepthResult, Placement
from kvwatch.store import create_engine_for
from kvwatch.store.migrate import downgrade_engine, upgrade_engine
from kvwatch.store.models import Marker
from kvwatch.store.records import DepthEvidence
from tests.helpers.store import Store, get_probe
from tests.store.conftest import NewProbeFactory, insert_old_rows, outcome


def _placements() -> tuple[Placement, ...]:
    return tuple(Placement(d, new_marker()) for d in (0.0, 0.5, 1.0))


def test_a_running_probe_shows_its_planted_markers_unjudged(
    store: Store, new_probe: NewProbeFactory
) -> None:
    """begin_probe writes each depth's marker with no outcome yet, and issues all three."""
    placed = _placements()
    pid = store.begin_probe(new_probe(marker=placed[0].marker, placements=placed))
    row = get_probe(store, pid)
    assert row is not None
    assert row.depths == tuple(DepthEvidence(p.depth, p.marker, None) for p in placed)
    with store.engine.connect() as c:
        issued = set(c.scalars(select(Marker.marker).where(Marker.probe_id == pid)))
    assert issued == {canonical(p.marker) for p in placed}


def test_finishing_stores_each_outcome_and_an_unanswered_probe_keeps_the_plan(
    store: Store, new_probe: NewProbeFactory
) -> None:
    """Outcomes replace the plan when judged; without an answer the planted list stays."""
    placed = _placements()
    judged = [
        DepthResult(p.depth, p.marker, o)
        for p, o in zip(
            placed, [DepthOutcome.MISSING, DepthOutcome.FOUND, DepthOutcome.FOUND], strict=True
        )
    ]
    pid = store.begin_probe(new_probe(marker=placed[0].marker, placements=placed))
    store.finish_probe(pid, outcome("marker_missing", marker_found=False, depths=judged))
    row = get_probe(store, pid)
    assert row is not None
    assert [d.outcome for d in row.depths] == ["missing", "found", "found"]

    other = _placements()
    pid = store.begin_probe(new_probe(marker=other[0].marker, placements=other))
    store.finish_probe(pid, outcome("error", marker_found=None))
    row = get_probe(store, pid)
    assert row is not None and [d.outcome for d in row.depths] == [None, None, None]


def test_a_probe_written_whole_keeps_its_judged_depths(
    store: Store, new_probe: NewProbeFactory
) -> None:
    """record_probe (the database was down at the start) stores the outcomes, not the plan."""
    placed = _placements()
    judged = [DepthResult(p.depth, p.marker, DepthOutcome.FOUND) for p in placed]
    pid = store.record_probe(
        new_probe(marker=placed[0].marker, placements=placed), outcome(depths=judged)
    )
    row = get_probe(store, pid)
    assert row is not None and [d.outcome for d in row.depths] == ["found"] * 3
    assert set(store.lookup_markers([canonical(p.marker) for p in placed])) == {
        canonical(p.marker) for p in placed
    }


def test_a_single_marker_probe_has_no_depth_list(store: Store, new_probe: NewProbeFactory) -> None:
    """The usual probe is stored exactly as before: depth_outcomes stays NULL."""
    pid = store.begin_probe(new_probe())
    store.finish_probe(pid, outcome())
    row = get_probe(store, pid)
    assert row is not None and row.depths == ()


def test_migration_0008_adds_depth_outcomes_to_old_rows_as_null_and_drops_it_back(
    db_url: str,
) -> None:
    """A probe stored at 0005 survives 0008 (and every later revision: the store reads the
    newest schema) with no depths; downgrading removes the column."""
    engine = create_engine_for(db_url)
    try:
        upgrade_engine(engine, "0005")
        tables = MetaData()
        tables.reflect(engine)
        with engine.begin() as c:
            insert_old_rows(c, tables, {"id": 7})
        upgrade_engine(engine, "head")
        row = get_probe(Store(engine), 7)
        assert row is not None and row.depths == () and row.verdict == "pass"
        downgrade_engine(engine, "0005")
        columns = {c["name"] for c in inspect(engine).get_columns("probes")}
        assert "depth_outcomes" not in columns and "region" in columns
    finally:
        engine.dispose()
