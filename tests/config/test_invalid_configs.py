"""Each tests/config/invalid/<name>.yaml fails with exactly the lines in <name>.error."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvwatch.config import ConfigError, load_config

INVALID = Path(__file__).parent / "invalid"
CASES = sorted(path.stem for path in INVALID.glob("*.yaml"))


def test_there_are_at_least_twenty_invalid_configs_each_with_its_error() -> None:
    """The invalid corpus is large and every file is paired with its expected error."""
    assert len(CASES) >= 20
    assert sorted(path.stem for path in INVALID.glob("*.error")) == CASES


@pytest.mark.parametrize("name", CASES)
def test_it_rejects_the_invalid_config_with_its_exact_error(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading the file raises ConfigError whose lines equal the paired .error file."""
    # Relative to the corpus, so error lines name the file as a user would have typed it.
    monkeypatch.chdir(INVALID)
    expected = (INVALID / f"{name}.error").read_text(encoding="utf-8").splitlines()
    with pytest.raises(ConfigError) as caught:
        load_config(Path(f"{name}.yaml"), env={})
    assert caught.value.errors == expected
    assert str(caught.value) == "\n".join(expected)
