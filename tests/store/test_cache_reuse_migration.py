"""probes.cached_prompt_tokens and a cache probe's steps: written with the probe's outcome,
read back, and added by the cache-reuse migration without touching older rows.

The migration is found by what it does (the revision whose script adds the column), never
by its number, so a renumbering at merge does not break these tests.
"""

from __future__ import annotations

from pathlib import Path

from alembic.script import ScriptDirectory
from sqlalchemy import MetaData, inspect, select

from kvwatch.canary.model import CacheOutcome, CacheStep
from kvwatch.store import create_engine_for
from kvwatch.store.migrate import alembic_config, downgrade_engine, upgrade_engine
from kvwatch.store.models import Marker
from tests.helpers.store import Store, get_probe
from tests.store.conftest import NewProbeFactory, insert_old_rows, outcome


def _cache_revision() -> tuple[str, str]:
    """(the revision adding probes.cached_prompt_tokens, the one before it)."""
    scripts = ScriptDirectory.from_config(alembic_config())
    for rev in scripts.walk_revisions():
        source = Path(rev.path).read_text()
        if 'add_column(sa.Column("cached_prompt_tokens"' in source:
            assert isinstance(rev.down_revision, str)
            return rev.revision, rev.down_revision
    raise AssertionError("no migration adds probes.cached_prompt_tokens")


def test_the_cached_tokens_and_steps_are_stored_with_the_outcome(
    store: Store, new_probe: NewProbeFactory
) -> None:
    """A finished cache probe reads back its summed cached tokens and every step; a probe
    whose engine said nothing keeps None (absent is not 0)."""
    step = CacheStep("warm", "A", "jade", "KVW-AAAA-BBBB-CCCC", CacheOutcome.RIGHT, 200, 2992)
    cached = store.begin_probe(new_probe())
    store.finish_probe(cached, outcome(cached_prompt_tokens=2992, cache=(step,)))
    row = get_probe(store, cached)
    assert row is not None and row.cached_prompt_tokens == 2992
    assert row.cache == (step,) and row.burst == () and row.depths == ()
    silent = store.begin_probe(new_probe())
    store.finish_probe(silent, outcome())
    row = get_probe(store, silent)
    assert row is not None and row.cached_prompt_tokens is None and row.cache == ()


def test_the_migration_leaves_old_probes_without_cached_tokens_and_drops_it_back(
    db_url: str,
) -> None:
    """A probe stored before the cache-reuse revision reads back with cached tokens None
    after it; downgrading removes the column and keeps the probe and its issued marker."""
    revision, before = _cache_revision()
    engine = create_engine_for(db_url)
    try:
        upgrade_engine(engine, before)
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
        assert row is not None and row.cached_prompt_tokens is None and row.verdict == "pass"
        assert revision != before
        downgrade_engine(engine, before)
        columns = {c["name"] for c in inspect(engine).get_columns("probes")}
        assert "cached_prompt_tokens" not in columns and "trace_id" in columns
        with engine.connect() as c:
            assert c.execute(select(Marker.probe_id)).scalars().all() == [7]
            assert c.execute(select(tables.tables["probes"].c.id)).scalars().all() == [7]
    finally:
        engine.dispose()
