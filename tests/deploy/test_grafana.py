"""deploy/grafana: the dashboard queries only metrics kvwatch exports, in valid PromQL."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from kvwatch.alerting.delivery import DeliveryMetrics
from kvwatch.metrics import ProbeMetrics
from tests.deploy.tools import ROOT, require_tool

GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "kvwatch-overview.json"
RULES = ROOT / "deploy" / "prometheus" / "kvwatch-rules.yaml"
COMPOSE = ROOT / "deploy" / "compose" / "docker-compose.yml"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Grafana's macros and variables, replaced by values promtool can parse.
MACROS = {"$__rate_interval": "5m", "$__range": "6h", "$endpoint": ".*"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool"}
PROMQL_WORDS |= {"and", "or", "unless", "offset", "inf", "nan"}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def query_panels() -> list[dict[str, Any]]:
    """Every panel but the rows, which only group the panels below them and query nothing."""
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def expressions() -> list[str]:
    return [t["expr"] for p in query_panels() for t in p["targets"]]


def recorded_series_names() -> set[str]:
    """The series the shipped recording rules (the canary SLO group) make out of kvwatch's."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}


def exported_series_names() -> set[str]:
    """Every series name kvwatch's real registries expose (probe and delivery metrics)."""
    registry = CollectorRegistry()
    ProbeMetrics(registry)
    DeliveryMetrics(registry)
    names: set[str] = set()
    for family in registry.collect():
        suffixes = {
            "counter": ("_total",),
            "histogram": ("_bucket", "_count", "_sum"),
        }.get(family.type, ("",))
        names |= {family.name + suffix for suffix in suffixes}
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (a lexer, not a full parser)."""
    for macro, value in MACROS.items():
        expr = expr.replace(macro, value)
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    # Grouping clauses name labels, not metrics; without them `sum (` reads as a call.
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*(\([^)]*\))?", "", expr)
    names = re.findall(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", expr)
    return {n for n in names if n.lower() not in PROMQL_WORDS}


def test_the_metric_lexer_finds_selectors_and_skips_functions_and_labels() -> None:
    """The extractor itself: names in, functions, grouping labels and matchers out."""
    expr = (
        'histogram_quantile(0.9, sum by (le, endpoint) (rate(a_bucket{x="b_total"}[$__range])))'
        " / on (endpoint) group_left c_total offset 5m"
    )
    assert metric_names(expr) == {"a_bucket", "c_total"}


def test_every_panel_queries_only_metrics_kvwatch_exports() -> None:
    """Each name in each panel's PromQL is a series of ProbeMetrics, DeliveryMetrics, up, or
    one the shipped recording rules record."""
    known = exported_series_names() | recorded_series_names() | {"up"}
    used = set().union(*(metric_names(e) for e in expressions()))
    assert used, "no metric found in the dashboard"
    assert used <= known, f"not exported by kvwatch: {sorted(used - known)}"


def test_the_dashboard_covers_verdicts_durations_tokens_alerts_and_delivery() -> None:
    """The panels the issue asks for are there, by the metric each one needs."""
    used = set().union(*(metric_names(e) for e in expressions()))
    for name in (
        "kvwatch_probes_total",
        "kvwatch_probe_duration_seconds_bucket",
        "kvwatch_canary_tokens_total",
        "kvwatch_alerts_firing",
        "kvwatch_alertmanager_notifications_errors_total",
    ):
        assert name in used, name
    assert any("histogram_quantile" in e for e in expressions())


def test_the_slo_row_shows_the_sli_the_budget_left_and_every_alerting_burn_rate() -> None:
    """Below a "Canary SLO" row: the recorded SLI, the budget remaining, and the burn rates
    of the four long windows the burn-rate alerts watch."""
    panels = dashboard()["panels"]
    (row,) = [p for p in panels if p["type"] == "row" and p["title"] == "Canary SLO"]
    below = [p for p in query_panels() if p["gridPos"]["y"] > row["gridPos"]["y"]]
    queries = "\n".join(t["expr"] for p in below for t in p["targets"])
    assert "kvwatch:canary_sli:ratio_rate1h" in queries
    assert "kvwatch:canary_slo:objective" in queries
    assert any("budget remaining" in p["title"].lower() for p in below)
    for window in ("1h", "6h", "1d", "3d"):
        assert f"kvwatch:canary_slo_burn:rate{window}{{" in queries, window


def test_promtool_parses_every_panel_query(tmp_path: Path) -> None:
    """Every expression is valid PromQL: promtool checks them as recording rules."""
    promtool = require_tool("promtool", install="apt-get install prometheus")
    rules = []
    for i, expr in enumerate(expressions()):
        for macro, value in MACROS.items():
            expr = expr.replace(macro, value)
        rules.append({"record": f"dashboard:query_{i}", "expr": expr})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_dashboard_has_a_stable_uid_and_a_datasource_variable() -> None:
    """uid kvwatch-overview; every panel and query goes through ${datasource}."""
    board = dashboard()
    assert board["uid"] == "kvwatch-overview"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["endpoint"]["datasource"] == DATASOURCE
    panel_ids = [p["id"] for p in board["panels"]]
    assert len(panel_ids) == len(set(panel_ids))
    for panel in query_panels():
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert all(t["datasource"] == DATASOURCE for t in panel["targets"]), panel["title"]


def test_provisioning_loads_the_dashboard_from_where_compose_mounts_it() -> None:
    """The provider's path is the compose mount of deploy/grafana/dashboards; the data source
    is the compose stack's Prometheus."""
    (provider,) = yaml.safe_load(
        (GRAFANA / "provisioning" / "dashboards" / "kvwatch.yaml").read_text()
    )["providers"]
    grafana = yaml.safe_load(COMPOSE.read_text())["services"]["grafana"]
    mounts = dict(v.rsplit(":", 1)[0].split(":", 1) for v in grafana["volumes"])
    assert mounts["../grafana/dashboards"] == provider["options"]["path"]
    (source,) = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yaml").read_text()
    )["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"


def test_a_panel_shows_the_burst_probes_verdicts_and_names_its_alerts() -> None:
    """The batch path has its own panel: burst probes by verdict, with both alerts named."""
    (panel,) = [
        p
        for p in dashboard()["panels"]
        if any('probe="burst"' in t.get("expr", "") for t in p.get("targets", []))
    ]
    assert "kvwatch_probes_total" in panel["targets"][0]["expr"]
    assert "KVWatchBurstWrong" in panel["description"]
    assert "KVWatchCrossRequestLeak" in panel["description"]


def test_a_panel_shows_the_cache_probes_verdicts_and_names_its_alert() -> None:
    """The prefix-cache path has its own panel: cache probes by verdict, its alert named."""
    (panel,) = [
        p
        for p in dashboard()["panels"]
        if any('probe="cache"' in t.get("expr", "") for t in p.get("targets", []))
    ]
    assert "kvwatch_probes_total" in panel["targets"][0]["expr"]
    assert "KVWatchCacheCorrupt" in panel["description"]
    assert "cache_not_exercised" in panel["description"]
