"""A real Alertmanager for tests, and HTTP receivers that record what they are sent.

``AlertmanagerProcess`` runs the Debian ``prometheus-alertmanager`` (or upstream
``alertmanager``) binary on a free loopback port with clustering off, routing every alert to
a webhook at once. ``RecordingServer`` is a tiny threaded HTTP server that stores every JSON
body it receives and answers with a status the test chooses: the webhook receiver, and the
stand-in Alertmanager when a test needs an exact payload or a 5xx.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import pytest

ALERTMANAGER_BINARIES = ("prometheus-alertmanager", "alertmanager")


def require_binary(*names: str, package: str = "prometheus-alertmanager") -> str:
    """The path of the first of ``names`` on PATH; fail under CI, skip elsewhere, if none."""
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    message = (
        f"none of {', '.join(names)} on PATH (Debian: apt-get install prometheus-alertmanager)"
    )
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Poll ``predicate`` until true; fail the test with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}")


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any  # parsed JSON, or the raw text when it was not JSON


class RecordingServer:
    """Records every request; answers ``status`` (settable while running) with ``{}``."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length).decode()
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw
                with recorder._lock:
                    recorder.requests.append(
                        Recorded("POST", self.path, dict(self.headers.items()), body)
                    )
                    status = recorder.status
                payload = b"{}"
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                # Keep test output for failures, not for every request.
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def bodies(self) -> list[Any]:
        with self._lock:
            return [r.body for r in self.requests]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> RecordingServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def webhook_config(webhook_url: str) -> str:
    """Route every alert, each in its own group, straight to the webhook."""
    return f"""\
route:
  receiver: recorder
  group_by: ['...']
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1m
receivers:
  - name: recorder
    webhook_configs:
      - url: {webhook_url}/hook
        send_resolved: true
"""


class AlertmanagerProcess:
    """A real Alertmanager on a free loopback port; ``stop()`` and ``start()`` keep the port."""

    def __init__(self, webhook_url: str, binary: str | None = None) -> None:
        self.binary = binary or require_binary(*ALERTMANAGER_BINARIES)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = Path(tempfile.mkdtemp(prefix="kvwatch-am-"))
        self.config_file = self._dir / "alertmanager.yml"
        self.config_file.write_text(webhook_config(webhook_url))
        self._log = self._dir / "alertmanager.log"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        storage = self._dir / "data"
        storage.mkdir(exist_ok=True)
        with self._log.open("ab") as log:
            self._process = subprocess.Popen(
                [
                    self.binary,
                    f"--config.file={self.config_file}",
                    f"--storage.path={storage}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--cluster.listen-address=",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                pytest.fail(f"alertmanager exited at start:\n{self._log.read_text()}")
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        pytest.fail(f"alertmanager not ready after 20s:\n{self._log.read_text()}")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
        self._process = None

    def alerts(self) -> list[dict[str, Any]]:
        """``GET /api/v2/alerts``: what this Alertmanager holds now."""
        response = httpx.get(f"{self.url}/api/v2/alerts", timeout=5)
        response.raise_for_status()
        alerts: list[dict[str, Any]] = response.json()
        return alerts

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self._dir, ignore_errors=True)


def running_alertmanager(webhook_url: str) -> Iterator[AlertmanagerProcess]:
    """Generator body for a fixture: a started Alertmanager, closed afterwards."""
    process = AlertmanagerProcess(webhook_url)
    try:
        process.start()
        yield process
    finally:
        process.close()
