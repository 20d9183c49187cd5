"""Fixtures for the hostile-endpoint tests: a migrated SQLite store of their own.

The hostile matrix is about what kvwatch makes of broken peers, not about the database, so
it runs on SQLite only (the store's own tests cover both backends).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvwatch.store.engine import create_engine_for
from kvwatch.store.migrate import upgrade_engine
from kvwatch.store.repository import Store


@pytest.fixture(scope="module")
def sqlite_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """A freshly migrated SQLite store shared by one test module."""
    path: Path = tmp_path_factory.mktemp("hostile") / "kvwatch.db"
    engine = create_engine_for(f"sqlite:///{path}")
    upgrade_engine(engine)
    try:
        yield Store(engine)
    finally:
        engine.dispose()
