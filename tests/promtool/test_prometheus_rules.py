"""kvwatch's Prometheus rules and example Alertmanager config, checked by the real tools."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kvwatch.alerting.policy import default_policy
from tests.helpers.alertmanager import require_binary

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "kvwatch-rules.yaml"
PROMETHEUS_RULE = ROOT / "deploy" / "prometheus" / "prometheusrule.yaml"
ALERTMANAGER_CONFIG = ROOT / "deploy" / "alertmanager" / "alertmanager.yml"
UNIT_TESTS = sorted(Path(__file__).parent.glob("*.test.yaml"))


def run(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)


def rules() -> list[dict[str, object]]:
    """The alerting rules (the SLO group's recording rules have no alert, labels or runbook)."""
    return [
        rule
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
        if "alert" in rule
    ]


def require_promtool() -> str:
    """promtool's path. Its absence fails, never skips: untested rules page nobody, or everyone."""
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not on PATH (Debian: apt-get install prometheus)")
    return found


def test_promtool_accepts_the_rules_file() -> None:
    """promtool check rules: the rules parse and are well formed."""
    promtool = require_promtool()
    result = run(promtool, "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_pass_their_promtool_unit_tests() -> None:
    """promtool test rules: every alert fires, and stays quiet, exactly as tabled."""
    promtool = require_promtool()
    assert UNIT_TESTS, "no *.test.yaml under tests/promtool"
    result = run(promtool, "test", "rules", *(t.name for t in UNIT_TESTS), cwd=UNIT_TESTS[0].parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_prometheusrule_manifest_holds_exactly_the_same_groups() -> None:
    """The Kubernetes manifest cannot drift from the plain rules file."""
    manifest = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert manifest["kind"] == "PrometheusRule"
    assert manifest["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert manifest["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_there_is_a_rule_for_every_direct_alert_and_for_kvwatch_itself() -> None:
    """Each alert kvwatch pushes has a Prometheus mirror, at the same severity."""
    by_name = {rule["alert"]: rule for rule in rules()}
    for name, alert in default_policy().alerts.items():
        assert by_name[name]["labels"] == {"severity": alert.severity.value}, name  # type: ignore[index]
    assert {"KVWatchStale", "KVWatchDown", "KVWatchAlertmanagerSendErrors"} <= by_name.keys()


def test_every_rule_links_the_runbook_section_of_its_own_name() -> None:
    """runbook_url anchors on the lower-case alert name, and docs/runbooks.md has that section."""
    runbooks = (ROOT / "docs" / "runbooks.md").read_text()
    for rule in rules():
        name = str(rule["alert"])
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        assert annotations["runbook_url"] == default_policy().runbook_url(name)
        assert f"\n## {name}\n" in runbooks, name


def test_amtool_accepts_the_example_alertmanager_config() -> None:
    """amtool check-config: the example routing is valid Alertmanager configuration."""
    amtool = require_binary("amtool")
    result = run(amtool, "check-config", str(ALERTMANAGER_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_example_config_pages_critical_and_tickets_warning() -> None:
    """Routing: severity=critical goes to the pager, severity=warning to the ticket receiver."""
    amtool = require_binary("amtool")
    for severity, receiver in (("critical", "pager"), ("warning", "ticket")):
        result = run(
            amtool,
            "config",
            "routes",
            "test",
            f"--config.file={ALERTMANAGER_CONFIG}",
            "alertname=KVWatchContextNotHonored",
            f"severity={severity}",
        )
        assert result.stdout.strip() == receiver, result.stdout + result.stderr
