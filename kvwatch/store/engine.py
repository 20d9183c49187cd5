"""Engines for the two supported databases, configured the way a long-running daemon needs."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from kvwatch.store.errors import StoreError

# How long a SQLite connection waits for another's lock before "database is locked". Long,
# because giving up is worse than waiting: the daemon's start-up migration failed when a reader
# (the CLI's history, a test's poller) held a lock through a 5 s stall of a loaded machine.
SQLITE_BUSY_TIMEOUT_MS = 30_000
# The daemon runs a handful of probe jobs at once through asyncio.to_thread; a small pool with
# a little overflow covers them plus the web layer without hogging a shared server.
POSTGRES_POOL_SIZE = 5
POSTGRES_MAX_OVERFLOW = 5
POSTGRES_CONNECT_TIMEOUT_S = 10


def create_engine_for(url: str) -> Engine:
    """An engine for ``url``: ``sqlite:///path`` or ``postgresql+psycopg://...``.

    A bare ``postgresql://`` means psycopg 3, the driver kvwatch ships with.
    """
    parsed = _parse(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(parsed)
    if backend == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        return _postgres_engine(parsed)
    raise StoreError(
        f"unsupported database scheme {parsed.drivername!r} in "
        f"{parsed.render_as_string(hide_password=True)}: use sqlite:///PATH or "
        "postgresql+psycopg://USER@HOST/DB"
    )


def _parse(url: str) -> URL:
    try:
        return make_url(url)
    except ArgumentError:
        # The text may be a mistyped URL with a password in it: show only what precedes "://".
        scheme = url.split("://", 1)[0] if "://" in url else ""
        shown = f"scheme {scheme!r}" if scheme else "no scheme"
        raise StoreError(
            f"database URL is not a URL ({shown}): expected sqlite:///PATH or "
            "postgresql+psycopg://USER@HOST/DB"
        ) from None


def _sqlite_engine(url: URL) -> Engine:
    database = url.database
    if not database or database == ":memory:" or url.query.get("mode") == "memory":
        # Every pooled connection would get its own empty database.
        raise StoreError(
            "in-memory SQLite is not supported: give a file path, e.g. sqlite:///kvwatch.db"
        )
    directory = Path(database).expanduser().resolve().parent
    if not directory.is_dir():
        raise StoreError(
            f"database directory {directory} does not exist (from "
            f"{url.render_as_string(hide_password=True)}); create it first"
        )
    # sqlite3's own timeout is the busy wait from the moment of connecting, so it covers the
    # pragmas below too (they run before busy_timeout is set), except where SQLite skips the
    # busy wait (see _journal_mode_wal).
    engine = _create(url, {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}})
    event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Per connection, because SQLite forgets all but journal_mode when a connection closes.
    # WAL lets the web layer read while a probe writes; busy_timeout makes writers wait for
    # each other instead of failing at once; NORMAL is durable enough under WAL.
    cursor = dbapi_connection.cursor()
    try:
        _journal_mode_wal(cursor)
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def _journal_mode_wal(cursor: Any) -> None:
    """``PRAGMA journal_mode=WAL``, waiting out another connection's write lock.

    The busy wait does not cover it: turning a database that is not yet in WAL mode to WAL
    needs its exclusive lock, and where waiting for a lock could deadlock SQLite answers
    "database is locked" at once without calling the busy handler
    (https://www.sqlite.org/c3ref/busy_handler.html). So the daemon's first connection to a
    new database failed its migration when a CLI command or a test's poller was writing to
    the file at that moment. Retried for as long as the busy wait would have waited.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    pause = 0.01
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.5)


def _postgres_engine(url: URL) -> Engine:
    return _create(
        url,
        {
            # A database restart or failover must not surface as a failed probe write.
            "pool_pre_ping": True,
            "pool_size": POSTGRES_POOL_SIZE,
            "max_overflow": POSTGRES_MAX_OVERFLOW,
            "pool_recycle": 1800,
            "connect_args": {"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S},
        },
    )


def _create(url: URL, options: dict[str, Any]) -> Engine:
    try:
        return create_engine(url, **options)
    except (NoSuchModuleError, ImportError) as exc:
        raise StoreError(
            f"no database driver for scheme {url.drivername!r} "
            f"({url.render_as_string(hide_password=True)}): {exc}"
        ) from None
