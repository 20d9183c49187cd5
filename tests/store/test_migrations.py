"""The Alembic migrations build exactly the schema the models describe, both ways."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect

from kvwatch.store import Store, StoreError, create_engine_for
from kvwatch.store.migrate import (
    current_revision,
    downgrade_engine,
    head_revision,
    is_at_head,
    script_location,
    upgrade,
    upgrade_engine,
)
from kvwatch.store.models import Base

TABLES = {
    "endpoints",
    "probes",
    "markers",
    "alert_states",
    "probe_slots",
    "probe_rollups",
    "served_windows",
    "token_calibrations",
    "endpoint_fingerprints",
    "endpoint_changes",
}


def _schema_diff(engine: Engine) -> list[object]:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return list(compare_metadata(context, Base.metadata))


def _tables(engine: Engine) -> set[str]:
    return set(inspect(engine).get_table_names()) - {"alembic_version"}


def test_upgrade_downgrade_upgrade_round_trips(db_url: str) -> None:
    """The initial revision applies, reverts to nothing, and applies again."""
    engine = create_engine_for(db_url)
    try:
        assert current_revision(engine) is None
        upgrade_engine(engine)
        assert _tables(engine) == TABLES
        assert current_revision(engine) == head_revision()
        downgrade_engine(engine, "base")
        assert _tables(engine) == set()
        assert current_revision(engine) is None
        upgrade_engine(engine)
        assert _tables(engine) == TABLES
        assert is_at_head(engine)
    finally:
        engine.dispose()


def test_the_migrated_schema_matches_the_models(db_url: str) -> None:
    """Autogenerate finds no difference between the migrated database and the ORM metadata."""
    upgrade(db_url)
    engine = create_engine_for(db_url)
    try:
        assert _schema_diff(engine) == []
    finally:
        engine.dispose()


def test_upgrading_twice_is_harmless(db_url: str) -> None:
    """`kvwatch db upgrade` on an up-to-date database changes nothing."""
    upgrade(db_url)
    upgrade(db_url)
    engine = create_engine_for(db_url)
    try:
        assert is_at_head(engine)
    finally:
        engine.dispose()


def test_readiness_requires_the_schema_at_head(db_url: str) -> None:
    """A reachable but unmigrated database is not ready, and says how to fix it."""
    engine = create_engine_for(db_url)
    try:
        store = Store(engine)
        store.ping()
        ready, why = store.readiness()
        assert not ready
        assert why == f"schema at none, expected {head_revision()}: run `kvwatch db upgrade`"
        upgrade_engine(engine)
        assert store.readiness() == (True, f"database reachable, schema at {head_revision()}")
    finally:
        engine.dispose()


def test_migration_scripts_are_found_in_a_wheel_and_in_a_checkout(tmp_path: Path) -> None:
    """An installed kvwatch uses kvwatch/_migrations; a source checkout uses ./migrations."""
    checkout = tmp_path / "checkout"
    (checkout / "kvwatch").mkdir(parents=True)
    (checkout / "migrations").mkdir()
    (checkout / "migrations" / "env.py").touch()
    assert script_location(checkout / "kvwatch") == checkout / "migrations"

    installed = tmp_path / "site-packages" / "kvwatch"
    (installed / "_migrations").mkdir(parents=True)
    (installed / "_migrations" / "env.py").touch()
    assert script_location(installed) == installed / "_migrations"

    with pytest.raises(StoreError, match="migration scripts not found"):
        script_location(tmp_path / "elsewhere" / "kvwatch")
    assert (script_location() / "versions" / "0001_initial_schema.py").is_file()
