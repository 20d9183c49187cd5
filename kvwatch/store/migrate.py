"""Schema migrations: Alembic driven from code, so no alembic.ini has to travel with kvwatch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, func, select
from sqlalchemy.exc import SQLAlchemyError

import kvwatch
from kvwatch.store.engine import create_engine_for
from kvwatch.store.errors import StoreError

# Serialises concurrent upgrades from several replicas on PostgreSQL (an arbitrary constant
# that only kvwatch uses: "kvwm" in ASCII).
_ADVISORY_LOCK_KEY = 0x6B76776D


def script_location(package_dir: Path | None = None) -> Path:
    """The migration scripts: packaged in the wheel, or ``migrations/`` of a source checkout.

    The wheel force-includes the repository's ``migrations/`` as ``kvwatch/_migrations``.
    """
    if package_dir is None:
        package_dir = Path(kvwatch.__file__).resolve().parent
    for candidate in (package_dir / "_migrations", package_dir.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise StoreError(f"migration scripts not found next to {package_dir}; is kvwatch installed?")


def alembic_config(url: str | None = None) -> Config:
    """An Alembic config built in code; ``url`` is only needed when no connection is passed."""
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    if url is not None:
        # ConfigParser interpolation: a percent-encoded password must survive it.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str) -> None:
    """Bring the database at ``url`` to the newest schema."""
    engine = create_engine_for(url)
    try:
        upgrade_engine(engine)
    finally:
        engine.dispose()


def upgrade_engine(engine: Engine, revision: str = "head") -> None:
    """Upgrade the database behind ``engine`` to ``revision``."""
    _run(engine, revision, downgrade=False)


def downgrade_engine(engine: Engine, revision: str) -> None:
    """Downgrade the database behind ``engine`` to ``revision`` (``"base"`` drops everything)."""
    _run(engine, revision, downgrade=True)


def _run(engine: Engine, revision: str, *, downgrade: bool) -> None:
    config = alembic_config()
    try:
        with engine.connect() as connection:
            sqlite = connection.dialect.name == "sqlite"
            if sqlite:
                # SQLite's own procedure for schema changes: batch mode rebuilds a table by
                # copying it and dropping the old one, and with foreign keys on that drop
                # fires the ON DELETE actions of every row pointing at it (a rebuilt
                # ``probes`` would delete every marker). The pragma is a no-op inside a
                # transaction, so it is set before one begins and checked before commit.
                connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
                connection.commit()
                raw: Any = connection.connection.driver_connection  # sqlite3.Connection
                implicit = raw.isolation_level
                # Python's sqlite3 opens a transaction only before INSERT, UPDATE, DELETE or
                # REPLACE, so CREATE, DROP and ALTER outside one commit on their own: a
                # migration stopped halfway (SIGKILL, a failed step) would leave half a
                # schema that the next start cannot migrate ("table ... already exists").
                # So the migration's transaction is begun here, before its first DDL, and
                # the driver's own BEGIN is switched off meanwhile.
                raw.isolation_level = None
            try:
                with connection.begin():
                    if sqlite:
                        # IMMEDIATE: the write lock is taken now (waiting out busy_timeout),
                        # not halfway through when another writer could hold it.
                        connection.exec_driver_sql("BEGIN IMMEDIATE")
                    if connection.dialect.name == "postgresql":
                        # Released at commit; a second replica waits, then finds nothing.
                        connection.execute(select(func.pg_advisory_xact_lock(_ADVISORY_LOCK_KEY)))
                    config.attributes["connection"] = connection
                    if downgrade:
                        command.downgrade(config, revision)
                    else:
                        command.upgrade(config, revision)
                    if sqlite:
                        broken = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
                        if broken:
                            raise StoreError(
                                f"migration to {revision} would leave {len(broken)} broken "
                                f"references (first: {tuple(broken[0])}); rolled back"
                            )
            finally:
                if sqlite:
                    raw.isolation_level = implicit
                    connection.exec_driver_sql("PRAGMA foreign_keys=ON")
                    connection.commit()
    except SQLAlchemyError as exc:
        raise StoreError(f"migration to {revision} failed: {exc}") from exc


def head_revision() -> str:
    """The newest revision the installed kvwatch knows."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise StoreError("no migration revisions found")
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at; None when it was never migrated."""
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    except SQLAlchemyError as exc:
        raise StoreError(f"cannot read the schema revision: {exc}") from exc


def is_at_head(engine: Engine) -> bool:
    """Whether the database has every migration this kvwatch ships."""
    return current_revision(engine) == head_revision()
