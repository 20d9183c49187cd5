"""Running kvwatch itself (and its simulator) as real processes, the way users do."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import httpx

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kvwatch_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvwatch", *args]


def wait_for(
    what: str, check: Callable[[], T | None], timeout: float = 30.0, every: float = 0.2
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code < 500
    except httpx.HTTPError:
        return False


@contextmanager
def simulator_process(*endpoints: str, log: Path) -> Iterator[str]:
    """``kvwatch simulate`` in a subprocess; yields its base URL (http://127.0.0.1:PORT)."""
    port = free_port()
    args = ["simulate", "--listen", f"127.0.0.1:{port}"]
    for ep in endpoints:
        args += ["--endpoint", ep]
    with log.open("ab") as out:
        proc = subprocess.Popen(kvwatch_cmd(*args), stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        first = endpoints[0].split(",")[0].split("=")[1]
        wait_for("the simulator", lambda: _http_ok(f"{base}/{first}/v1/models"))
        yield base
    finally:
        stop(proc)


def start_kvwatch(
    *args: str, log: Path, cwd: Path | None = None, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with log.open("ab") as out:
        return subprocess.Popen(
            kvwatch_cmd(*args), stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env
        )


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 30) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode
