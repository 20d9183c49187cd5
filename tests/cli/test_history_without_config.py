"""After the zero-config demo, the history commands read what it wrote, with no config."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from kvwatch.cli import main
from kvwatch.demo import DEMO_DATABASE, DEMO_DATABASE_FILE
from kvwatch.store.migrate import upgrade


def _cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("command", [["results"], ["show", "1"], ["served-window"]])
def test_with_no_config_the_history_commands_read_the_demo_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    """No kvwatch.yaml, a ./kvwatch.db from `kvwatch run`: read it, and say so on stderr."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KVWATCH_CONFIG", raising=False)
    upgrade(DEMO_DATABASE)
    code, _out, err = _cli(*command)
    assert f"reading ./{DEMO_DATABASE_FILE}" in err
    assert "cannot read" not in err
    # show 1 finds no probe in an empty history (exit 1, said so); the others succeed.
    assert code == (1 if command[0] == "show" else 0), err


def test_with_no_config_and_no_demo_database_the_error_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing to read: exit 1 with a sentence naming both files and --config."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KVWATCH_CONFIG", raising=False)
    code, _out, err = _cli("results")
    assert code == 1
    assert "no kvwatch.yaml here and no ./kvwatch.db" in err and "--config" in err
    assert not (tmp_path / DEMO_DATABASE_FILE).exists()
