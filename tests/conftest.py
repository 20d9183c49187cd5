"""Shared pytest fixtures."""

from __future__ import annotations

# ===========================================================================================
# Database fixtures (owned by the store; see kvwatch/store). Every test that touches the store
# takes `db_url` or `store` and so runs twice: on a temporary SQLite file and on PostgreSQL.
#
# PostgreSQL: one database `kvwatch_test_<random>` per test session, created from the server
# named by KVWATCH_TEST_POSTGRES_URL (default: the `test` database on 127.0.0.1:5432) and
# dropped at the end; inside it, every test gets a fresh schema of its own, selected through
# the connection's search_path, so tests never see each other's rows and need no cleanup.
# Unreachable server: the postgres half fails when $CI is set, and is skipped otherwise.
#
# SQLite: the migrations run once per session into a template file, and each `store` gets a
# byte-for-byte copy of it (the same freshly migrated database, without ~0.2 s of Alembic per
# test). The migrations themselves are tested from an empty database in tests/store.
# ===========================================================================================
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import structlog
from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from kvwatch.store.engine import create_engine_for
from kvwatch.store.migrate import upgrade_engine
from tests.helpers.store import Store

DEFAULT_TEST_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _server_url() -> URL:
    return make_url(os.environ.get("KVWATCH_TEST_POSTGRES_URL", DEFAULT_TEST_POSTGRES_URL))


@pytest.fixture(scope="session")
def postgres_database_url() -> Iterator[URL]:
    """A throwaway PostgreSQL database for this test session (fails under CI if unreachable)."""
    server = _server_url()
    # NullPool: a connection per use, so a test that restarts PostgreSQL leaves no dead one.
    admin = create_engine(
        server,
        isolation_level="AUTOCOMMIT",
        connect_args={"connect_timeout": 5},
        poolclass=NullPool,
    )
    name = f"kvwatch_test_{secrets.token_hex(6)}"
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except SQLAlchemyError as exc:
        admin.dispose()
        reason = (
            f"PostgreSQL at {server.render_as_string(hide_password=True)} is unusable: "
            f"{str(exc.orig if hasattr(exc, 'orig') else exc).strip()}"
        )
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set, so the PostgreSQL tests must run)")
        pytest.skip(f"{reason} (set KVWATCH_TEST_POSTGRES_URL to point at a server)")
    try:
        yield server.set(database=name)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextmanager
def fresh_schema(database_url: URL) -> Iterator[str]:
    """A URL whose connections land in a fresh, empty schema of ``database_url``."""
    schema = f"t_{secrets.token_hex(6)}"
    admin = create_engine(database_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = database_url.update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def postgres_schema_url(postgres_database_url: URL) -> Iterator[str]:
    """A URL whose connections land in a fresh, empty schema of the session database."""
    with fresh_schema(postgres_database_url) as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """An empty database URL, once per supported backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('db') / 'kvwatch.db'}"
    url: str = request.getfixturevalue("postgres_schema_url")
    return url


@pytest.fixture(scope="session")
def migrated_sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once per session, closed (its WAL checkpointed)."""
    path = tmp_path_factory.mktemp("template") / "kvwatch.db"
    engine = create_engine_for(f"sqlite:///{path}")
    try:
        upgrade_engine(engine)
    finally:
        engine.dispose()
    assert not path.with_name(f"{path.name}-wal").exists()
    return path


@contextmanager
def migrated_store(request: pytest.FixtureRequest, db_url: str) -> Iterator[Store]:
    """A Store on the empty database at ``db_url``, migrated (SQLite: the template copied)."""
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        template: Path = request.getfixturevalue("migrated_sqlite_template")
        assert url.database is not None
        shutil.copyfile(template, url.database)
        engine = create_engine_for(db_url)
    else:
        engine = create_engine_for(db_url)
        upgrade_engine(engine)
    try:
        yield Store(engine)
    finally:
        engine.dispose()


@pytest.fixture
def store(request: pytest.FixtureRequest, db_url: str) -> Iterator[Store]:
    """A Store on a freshly migrated database, once per supported backend."""
    with migrated_store(request, db_url) as migrated:
        yield migrated


# ===========================================================================================
# End of database fixtures.
# ===========================================================================================


@pytest.fixture(autouse=True)
def _structlog_as_new() -> Iterator[None]:
    """Each test starts from structlog's defaults: a command run in-process (``kvwatch probe``
    configures warning level) must not hide the next test's info lines from capture_logs."""
    yield
    structlog.reset_defaults()
