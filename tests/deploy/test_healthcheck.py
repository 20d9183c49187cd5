"""`kvwatch healthcheck`: the image's HEALTHCHECK, against real HTTP servers on loopback."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvwatch.healthcheck import healthcheck, probe_url
from tests.helpers.processes import free_port


@pytest.mark.parametrize(
    ("listen", "url"),
    [
        ("0.0.0.0:9464", "http://127.0.0.1:9464/healthz"),
        ("[::]:9464", "http://[::1]:9464/healthz"),
        ("127.0.0.1:8080", "http://127.0.0.1:8080/healthz"),
        ("[::1]:9464", "http://[::1]:9464/healthz"),
        ("kvwatch.local:9464", "http://kvwatch.local:9464/healthz"),
    ],
)
def test_it_turns_a_listen_address_into_a_url_a_local_client_can_reach(
    listen: str, url: str
) -> None:
    """Wildcard binds become the loopback of their family; IPv6 hosts get brackets."""
    assert probe_url(listen) == url


@pytest.fixture
def server() -> Iterator[tuple[int, dict[str, int]]]:
    """A loopback HTTP server answering GET with the status set per path (404 otherwise)."""
    statuses: dict[str, int] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = statuses.get(self.path, 404)
            body = b"ok\n" if status == 200 else b"scheduler is not running\n"
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1], statuses
    finally:
        httpd.shutdown()
        httpd.server_close()


def config(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "kvwatch.yaml"
    path.write_text(f"listen: 0.0.0.0:{port}\n")
    return path


def test_it_exits_0_when_healthz_answers_200(
    server: tuple[int, dict[str, int]], tmp_path: Path
) -> None:
    """Healthy: /healthz on the configured port (0.0.0.0 reached via 127.0.0.1) says 200."""
    port, statuses = server
    statuses["/healthz"] = 200
    result = CliRunner().invoke(healthcheck, ["--config", str(config(tmp_path, port))])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"http://127.0.0.1:{port}/healthz: HTTP 200 ok"


def test_it_exits_1_with_the_servers_reason_on_503(
    server: tuple[int, dict[str, int]], tmp_path: Path
) -> None:
    """Unhealthy: a 503 is exit 1, and the answer's text says why."""
    port, statuses = server
    statuses["/healthz"] = 503
    result = CliRunner().invoke(healthcheck, ["--config", str(config(tmp_path, port))])
    assert result.exit_code == 1
    assert "HTTP 503 scheduler is not running" in result.output


def test_it_checks_readiness_with_path_readyz(
    server: tuple[int, dict[str, int]], tmp_path: Path
) -> None:
    """--path /readyz asks the readiness endpoint instead."""
    port, statuses = server
    statuses["/healthz"], statuses["/readyz"] = 200, 503
    args = ["--config", str(config(tmp_path, port)), "--path", "/readyz"]
    assert CliRunner().invoke(healthcheck, args).exit_code == 1


def test_it_exits_1_when_nothing_listens(tmp_path: Path) -> None:
    """A refused connection is unhealthy, not a crash."""
    port = free_port()
    result = CliRunner().invoke(healthcheck, ["--url", f"http://127.0.0.1:{port}/healthz"])
    assert result.exit_code == 1
    assert f"http://127.0.0.1:{port}/healthz:" in result.output


def test_it_exits_1_naming_the_problem_when_the_config_is_unreadable(tmp_path: Path) -> None:
    """A missing config file is unhealthy with the loader's message."""
    result = CliRunner().invoke(healthcheck, ["--config", str(tmp_path / "missing.yaml")])
    assert result.exit_code == 1
    assert "missing.yaml: cannot read" in result.output


def test_it_reads_the_config_path_from_kvwatch_config(
    server: tuple[int, dict[str, int]], tmp_path: Path
) -> None:
    """KVWATCH_CONFIG (set in the image) selects the config without --config."""
    port, statuses = server
    statuses["/healthz"] = 200
    env = {"KVWATCH_CONFIG": str(config(tmp_path, port))}
    assert CliRunner().invoke(healthcheck, [], env=env).exit_code == 0
