"""Libraries' standard-library log records come out as the same JSON lines as kvwatch's."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import structlog

from kvwatch.logs import configure
from kvwatch.store.migrate import upgrade


def test_alembics_migration_lines_are_json_with_their_logger_named(tmp_path: Path) -> None:
    """Running the migrations writes only JSON lines, each library line naming its logger."""
    stream = io.StringIO()
    configure("info", stream=stream)
    try:
        upgrade(f"sqlite:///{tmp_path / 'k.db'}")
        structlog.get_logger("kvwatch.test").info("after")
    finally:
        structlog.reset_defaults()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    migrations = [line for line in lines if line.get("logger") == "alembic.runtime.migration"]
    assert migrations and all(line["level"] == "info" for line in migrations)
    assert any(line["event"].startswith("Running upgrade") for line in migrations)
    assert lines[-1]["event"] == "after"


def test_configuring_twice_keeps_one_handler_and_others_handlers() -> None:
    """A second configure replaces kvwatch's own handler only."""
    other = logging.NullHandler()
    logging.getLogger().addHandler(other)
    try:
        configure("info", stream=io.StringIO())
        configure("info", stream=io.StringIO())
        names = [h.get_name() for h in logging.getLogger().handlers]
        assert names.count("kvwatch") == 1 and other in logging.getLogger().handlers
    finally:
        logging.getLogger().removeHandler(other)
        structlog.reset_defaults()
