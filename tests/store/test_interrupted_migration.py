"""A SQLite migration stopped halfway (a kill, a failed step) leaves the database as it found
it, so the next start migrates it instead of failing on "table ... already exists".

Python's sqlite3 begins a transaction only before INSERT/UPDATE/DELETE, so without kvwatch's
own BEGIN every CREATE, DROP and ALTER of a migration committed on its own. The stop is made
by raising from the statement hook at a chosen statement: what is on disk afterwards is what
a SIGKILL at that statement would leave, because an uncommitted transaction is discarded
either way.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, MetaData, event, inspect

from kvwatch.store import create_engine_for
from kvwatch.store.migrate import (
    alembic_config,
    current_revision,
    head_revision,
    upgrade_engine,
)
from tests.store.conftest import insert_old_rows


class Stopped(Exception):
    """Raised in place of a migration statement."""


@contextmanager
def stop_at(engine: Engine, statement: int | None) -> Iterator[list[str]]:
    """Count the statements ``engine`` runs (yielded), raising :class:`Stopped` instead of
    running the ``statement``-th (1-based; None: never)."""
    seen: list[str] = []

    def hook(_conn: Any, _cursor: Any, text: str, *_: Any) -> None:
        seen.append(text)
        if len(seen) == statement:
            raise Stopped(f"statement {statement}: {text[:60]}")

    event.listen(engine, "before_cursor_execute", hook)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", hook)


def _stoppable(engine: Engine) -> int:
    """How many statements a full upgrade of ``engine`` runs before it commits: all but the
    last, which turns foreign keys back on after the commit."""
    with stop_at(engine, None) as seen:
        upgrade_engine(engine)
    assert seen[-1] == "PRAGMA foreign_keys=ON", seen[-3:]
    return len(seen) - 1


def _schema(engine: Engine) -> dict[str, list[str]]:
    inspector = inspect(engine)
    return {t: [c["name"] for c in inspector.get_columns(t)] for t in inspector.get_table_names()}


def _spread(count: int, points: int) -> list[int]:
    """``points`` statement numbers spread over 1..count, first and last included."""
    return sorted({1 + round(i * (count - 1) / (points - 1)) for i in range(points)})


def test_a_fresh_database_whose_first_migration_stops_halfway_is_left_empty(
    tmp_path: Path,
) -> None:
    """Stopped at any of eight points of a fresh upgrade: no table is left, and the next
    upgrade reaches head."""
    probe = create_engine_for(f"sqlite:///{tmp_path / 'count.db'}")
    try:
        total = _stoppable(probe)
    finally:
        probe.dispose()
    for statement in _spread(total, 8):
        engine = create_engine_for(f"sqlite:///{tmp_path / f'stop-{statement}.db'}")
        try:
            with stop_at(engine, statement), pytest.raises(Stopped):
                upgrade_engine(engine)
            assert _schema(engine) == {}, f"stopped at statement {statement} of {total}"
            upgrade_engine(engine)
            assert current_revision(engine) == head_revision()
        finally:
            engine.dispose()


def test_an_upgrade_of_stored_history_stopped_at_any_statement_keeps_schema_and_rows(
    tmp_path: Path,
) -> None:
    """The newest migration, stopped at each of its statements in turn, leaves the schema and
    the probes stored before it untouched; run again, it completes and keeps them."""
    newest = ScriptDirectory.from_config(alembic_config()).get_revision(head_revision())
    assert newest is not None and isinstance(newest.down_revision, str)
    older = newest.down_revision
    original = tmp_path / "older.db"
    engine = create_engine_for(f"sqlite:///{original}")
    try:
        upgrade_engine(engine, older)
        tables = MetaData()
        tables.reflect(engine)
        with engine.begin() as connection:
            insert_old_rows(connection, tables, {"verdict": "pass"}, {"verdict": "no_marker"})
        before = _schema(engine)
    finally:
        engine.dispose()  # the last connection's close checkpoints the WAL into the file

    def copy_of_older(name: str) -> Engine:
        copy = tmp_path / name
        shutil.copyfile(original, copy)
        return create_engine_for(f"sqlite:///{copy}")

    counting = copy_of_older("count.db")
    try:
        total = _stoppable(counting)
    finally:
        counting.dispose()
    assert total > 0
    for statement in range(1, total + 1):
        where = f"stopped at statement {statement} of {total}"
        engine = copy_of_older(f"stop-{statement}.db")
        try:
            with stop_at(engine, statement), pytest.raises(Stopped):
                upgrade_engine(engine)
            assert current_revision(engine) == older, where
            assert _schema(engine) == before, where
            assert _verdicts(engine) == ["pass", "no_marker"], where
            upgrade_engine(engine)
            assert current_revision(engine) == head_revision(), where
            assert _verdicts(engine) == ["pass", "no_marker"], where
        finally:
            engine.dispose()


def _verdicts(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        return list(connection.exec_driver_sql("SELECT verdict FROM probes ORDER BY id").scalars())
