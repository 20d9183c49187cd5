"""Engines are set up for a long-running daemon, and bad URLs fail with a clear sentence."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from sqlalchemy import Connection, create_engine, text

from kvwatch.store import Store, StoreError, create_engine_for


def _pragma(connection: Connection, name: str) -> object:
    return connection.exec_driver_sql(f"PRAGMA {name}").scalar()


def test_each_backend_is_configured_for_a_long_running_daemon(db_url: str) -> None:
    """SQLite: WAL, busy_timeout, foreign keys on every connection; PostgreSQL: pre-ping
    replaces a connection the server killed instead of failing the next write."""
    engine = create_engine_for(db_url)
    try:
        if engine.dialect.name == "sqlite":
            # Two connections at once: pragmas must hold on each, not just the first.
            with engine.connect() as one, engine.connect() as two:
                for connection in (one, two):
                    assert _pragma(connection, "journal_mode") == "wal"
                    assert _pragma(connection, "busy_timeout") == 30_000
                    assert _pragma(connection, "foreign_keys") == 1
                    assert _pragma(connection, "synchronous") == 1  # NORMAL
        else:
            assert engine.dialect.name == "postgresql"
            with engine.connect() as connection:
                killed = connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
            # The victim now idles in the pool; kill it from outside that pool.
            admin = create_engine(engine.url, isolation_level="AUTOCOMMIT")
            with admin.connect() as connection:
                connection.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": killed})
            admin.dispose()
            Store(engine).ping()
    finally:
        engine.dispose()


def test_an_unsupported_scheme_is_named_and_the_password_hidden() -> None:
    """A MySQL URL fails naming its scheme, never echoing the password."""
    with pytest.raises(StoreError) as caught:
        create_engine_for("mysql://kv:hunter2@db/kvwatch")
    message = str(caught.value)
    assert message.startswith("unsupported database scheme 'mysql' in mysql://kv:***@db/kvwatch")
    assert "hunter2" not in message


def test_text_that_is_not_a_url_is_refused_without_echoing_it() -> None:
    """A malformed URL names only what stands before ://, not the rest."""
    with pytest.raises(StoreError, match="not a URL") as caught:
        create_engine_for("kvwatch.db")
    assert "kvwatch.db" not in str(caught.value)


def test_a_missing_driver_is_named() -> None:
    """A scheme whose driver is not installed says which scheme it was."""
    with pytest.raises(StoreError, match="no database driver for scheme 'postgresql\\+nodriver'"):
        create_engine_for("postgresql+nodriver://u:secret@h/db")


def test_a_bare_postgresql_url_uses_psycopg() -> None:
    """postgresql:// means the psycopg 3 driver that kvwatch ships with."""
    engine = create_engine_for("postgresql://u@127.0.0.1/db")
    try:
        assert engine.url.drivername == "postgresql+psycopg"
    finally:
        engine.dispose()


def test_a_sqlite_file_in_a_missing_directory_names_the_directory(tmp_path: Path) -> None:
    """The error names the directory to create instead of SQLite's 'unable to open'."""
    missing = tmp_path / "nope"
    with pytest.raises(StoreError, match=f"database directory {missing} does not exist"):
        create_engine_for(f"sqlite:///{missing}/kvwatch.db")


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_in_memory_sqlite_is_refused(url: str) -> None:
    """Each pooled connection would see its own empty database, so it is refused up front."""
    with pytest.raises(StoreError, match="in-memory SQLite is not supported"):
        create_engine_for(url)


def test_an_unreachable_database_fails_ping_and_readiness() -> None:
    """ping raises StoreError and readiness reports not ready with the reason."""
    engine = create_engine_for("postgresql+psycopg://postgres@127.0.0.1:1/none")
    try:
        store = Store(engine)
        with pytest.raises(StoreError, match="database unreachable"):
            store.ping()
        ready, why = store.readiness()
        assert not ready
        assert why.startswith("database unreachable")
    finally:
        engine.dispose()


def test_turning_a_new_database_to_wal_waits_for_another_connections_write(
    tmp_path: Path,
) -> None:
    """SQLite answers "database is locked" at once to the WAL switch while another
    connection writes (no busy wait there); the engine's first connection waits it out."""
    path = tmp_path / "kvwatch.db"
    writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    writer.execute("CREATE TABLE t (a)")
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO t VALUES (1)")
    released = threading.Timer(0.5, writer.execute, ("COMMIT",))
    released.start()
    engine = create_engine_for(f"sqlite:///{path}")
    try:
        with engine.connect() as connection:
            assert _pragma(connection, "journal_mode") == "wal"
            assert connection.exec_driver_sql("SELECT a FROM t").scalar() == 1
    finally:
        released.join()
        engine.dispose()
        writer.close()
