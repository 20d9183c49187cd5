"""Planted secrets never appear in anything kvwatch writes: logs, database, API, UI, metrics.

A real ``kvwatch run`` process gets an endpoint API key (``api_key_file``), Alertmanager
credentials (basic-auth ``password_file``, or a ``bearer_token``) and a web bearer token
(``web.bearer_token_file``), tenant keys (one ``api_key_file``, one inline, each accepted by
the simulator; two more it refuses), and runs a cycle full of failures: a 401 on tokenize, a
401 on chat, an unreachable engine, a critical verdict that pages an Alertmanager answering 500
and one refusing connections, under probes sent with tenant keys. Then every byte it wrote is
searched for every secret.
"""

from __future__ import annotations

import base64
import secrets
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.helpers.alertmanager import RecordingServer
from tests.helpers.processes import free_port, simulator_process, start_kvwatch, stop, wait_for

ENDPOINTS = ("weak", "locked", "locked-usage", "gone", "tenanted", "tenants-locked")


def planted(kind: str) -> str:
    return f"kvw-secret-{kind}-{secrets.token_hex(12)}"


def write_file(path: Path, value: str) -> str:
    path.write_text(value + "\n")
    path.chmod(0o600)
    return str(path)


def finished_endpoints(db: Path) -> set[str]:
    if not db.exists():
        return set()
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            rows = conn.execute("SELECT endpoint FROM probes WHERE state = 'done'").fetchall()
    except sqlite3.Error:
        return set()
    return {row[0] for row in rows}


def web_pages(listen: str, token: str) -> dict[str, bytes]:
    """Every API and UI page, with the web credentials; probe pages for each stored probe."""
    base = f"http://{listen}"
    auth = {"Authorization": f"Bearer {token}"}
    pages: dict[str, bytes] = {}
    with httpx.Client(base_url=base, headers=auth, timeout=10) as web:
        probes = web.get("/api/v1/probes", params={"limit": 100})
        assert probes.status_code == 200, probes.text
        ids = [item["id"] for item in probes.json()["probes"]]
        paths = ["/api/v1/probes", "/api/v1/endpoints", "/api/v1/alerts", "/metrics"]
        paths += ["/healthz", "/readyz", "/", "/probes", "/alerts"]
        paths += [f"/api/v1/probes/{i}" for i in ids] + [f"/probes/{i}" for i in ids]
        paths += [f"/endpoints/{name}" for name in ENDPOINTS]
        paths += [f"/api/v1/endpoints/{name}/summary" for name in ENDPOINTS]
        for path in paths:
            response = web.get(path)
            assert response.status_code == 200, f"{path}: {response.status_code}"
            pages[path] = response.content
        # A wrong credential is refused without echoing what was expected.
        refused = httpx.get(f"{base}/api/v1/probes", headers={"Authorization": "Bearer x"})
        assert refused.status_code == 401
        pages["refused"] = refused.content + str(refused.headers).encode()
    return pages


def needles(values: list[str]) -> list[bytes]:
    """Each secret, its random part alone (a prefix may be cut), and its base64 form."""
    found: list[bytes] = []
    for value in values:
        found += [value.encode(), value.rsplit("-", 1)[1].encode()]
        found.append(base64.b64encode(value.encode()))
    return found


@pytest.mark.parametrize("am_auth", ["basic_auth", "bearer_token"])
def test_no_secret_reaches_logs_database_api_ui_or_metrics(tmp_path: Path, am_auth: str) -> None:
    """After a cycle of 401s, unreachable engines and failed pages, no secret is anywhere."""
    api_key, am_secret, web_token = planted("apikey"), planted("am"), planted("web")
    tenant_keys = [planted(f"tenant{i}") for i in range(4)]
    closed = free_port()
    listen = f"127.0.0.1:{free_port()}"
    db = tmp_path / "kvwatch.db"
    log = tmp_path / "run.log"
    sims = (
        f"name=weak,window=4096,fault=no_recall,api_key={api_key}",
        "name=locked,window=4096,api_key=the-right-key",
        f"name=tenants,window=4096,fault=no_recall,tenant_keys={tenant_keys[0]}:{tenant_keys[1]}",
    )
    with (
        simulator_process(*sims, log=tmp_path / "sim.log") as sim,
        RecordingServer(status=500) as alertmanager,
    ):
        am: dict[str, Any] = {"urls": [alertmanager.url, f"http://127.0.0.1:{closed}"]}
        if am_auth == "basic_auth":
            am["basic_auth"] = {
                "username": "kvwatch",
                "password_file": write_file(tmp_path / "am-password", am_secret),
            }
            sent = "Basic " + base64.b64encode(f"kvwatch:{am_secret}".encode()).decode()
        else:
            am["bearer_token"] = am_secret
            sent = f"Bearer {am_secret}"
        key_file = write_file(tmp_path / "api-key", api_key)

        tenant_file = write_file(tmp_path / "tenant-key", tenant_keys[0])

        def tenants(first: dict[str, str], second: str) -> list[dict[str, str]]:
            return [{"name": "acme", **first}, {"name": "globex", "api_key": second}]

        def endpoint(name: str, url: str, probe: str, **extra: Any) -> dict[str, Any]:
            # An endpoint with tenants sends their keys instead of the endpoint's own.
            key = {} if "tenants" in extra else {"api_key_file": key_file}
            return {
                "name": name,
                "url": url,
                "model": "sim-1",
                "context_window": 4096,
                **key,
                "probes": [probe],
                **extra,
            }

        config = {
            "database": f"sqlite:///{db}",
            "listen": listen,
            "replica": "secrets-test",
            "log_level": "debug",
            "alertmanager": {**am, "timeout": "2s"},
            "web": {"bearer_token_file": write_file(tmp_path / "web-token", web_token)},
            "defaults": {"interval": "1h", "jitter": "0s", "timeouts": {"under": "30s"}},
            "endpoints": [
                endpoint("weak", f"{sim}/weak/v1", "under"),  # marker_missing, confirmed: pages
                endpoint("locked", f"{sim}/locked/v1", "baseline"),  # 401 on tokenize
                endpoint("locked-usage", f"{sim}/locked/v1", "baseline", tokenizer="usage"),
                endpoint("gone", f"http://127.0.0.1:{closed}/v1", "baseline"),  # unreachable
                # marker_missing under a tenant's key, confirmed: pages.
                endpoint(
                    "tenanted",
                    f"{sim}/tenants/v1",
                    "under",
                    tenants=tenants({"api_key_file": tenant_file}, tenant_keys[1]),
                ),
                # Tenant keys the engine refuses: 401 on tokenize.
                endpoint(
                    "tenants-locked",
                    f"{sim}/locked/v1",
                    "under",
                    tenants=tenants({"api_key": tenant_keys[2]}, tenant_keys[3]),
                ),
            ],
        }
        path = tmp_path / "kvwatch.yaml"
        path.write_text(yaml.safe_dump(config))
        proc = start_kvwatch("run", "--config", str(path), log=log)
        try:
            wait_for(
                "a probe of every endpoint",
                lambda: finished_endpoints(db) >= set(ENDPOINTS),
                timeout=90,
            )
            wait_for("a page to reach the Alertmanager", lambda: alertmanager.requests, timeout=60)
            pages = web_pages(listen, web_token)
            written_while_running = {p.name: p.read_bytes() for p in tmp_path.glob("kvwatch.db*")}
        finally:
            code = stop(proc)
        assert code == 0, log.read_text()
        # The secrets were really used: the key passed the simulator, the credentials went out.
        assert alertmanager.requests[0].headers.get("Authorization") == sent
    with sqlite3.connect(db) as conn:
        verdicts = dict(conn.execute("SELECT endpoint, verdict FROM probes"))
    assert verdicts == {
        "weak": "marker_missing",
        "locked": "auth_error",
        "locked-usage": "auth_error",
        "gone": "error",
        "tenanted": "marker_missing",
        "tenants-locked": "auth_error",
    }, verdicts

    log_bytes = log.read_bytes()
    # httpx request lines ("HTTP Request: POST ...") stay off even at debug level.
    assert b"HTTP Request:" not in log_bytes
    outputs = {"log": log_bytes, **pages, **written_while_running}
    outputs |= {f"after exit {p.name}": p.read_bytes() for p in tmp_path.glob("kvwatch.db*")}
    for secret in needles([api_key, am_secret, web_token, *tenant_keys]):
        leaks = [name for name, data in outputs.items() if secret in data]
        assert not leaks, f"{secret!r} written to {leaks}"
