"""The canary SLO group: its verdict sets are the code's, its windows and burn factors the
workbook's. Its behaviour is tested by promtool (kvwatch-slo.test.yaml, run with the other
*.test.yaml files by test_prometheus_rules.py)."""

from __future__ import annotations

import re
from typing import Any

import yaml

from kvwatch.canary.model import HEALTHY, INCONCLUSIVE, Verdict
from tests.promtool.test_prometheus_rules import RULES

WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
# (long window, short window, burn factor, severity): the SRE workbook's table, ch. 5.
BURN_ALERTS = {
    ("1h", "5m", 14.4, "critical"),
    ("6h", "30m", 6.0, "critical"),
    ("1d", "2h", 3.0, "warning"),
    ("3d", "6h", 1.0, "warning"),
}


def slo_rules() -> list[dict[str, Any]]:
    (group,) = [
        g for g in yaml.safe_load(RULES.read_text())["groups"] if g["name"] == "kvwatch-slo"
    ]
    rules: list[dict[str, Any]] = group["rules"]
    return rules


def recorded(name: str) -> dict[str, Any]:
    (rule,) = [r for r in slo_rules() if r.get("record") == name]
    return rule


def matched_verdicts(expr: str, operator: str) -> set[Verdict]:
    """The verdicts a `verdict=~"..."` (or `!~`) matcher in ``expr`` names, every one of them."""
    found = set(re.findall(rf'verdict{operator}"([^"]*)"', expr))
    assert len(found) == 1, f"one {operator} verdict matcher expected in {expr}"
    return {Verdict(v) for v in found.pop().split("|")}


def test_every_window_has_an_sli_and_a_burn_rate_over_the_probes_counter() -> None:
    """5m to 3d, each an SLI of kvwatch_probes_total per endpoint and a burn rate from it."""
    for window in WINDOWS:
        sli = recorded(f"kvwatch:canary_sli:ratio_rate{window}")["expr"]
        assert "rate(kvwatch_probes_total{" in sli and f"[{window}]" in sli, window
        assert "sum by (endpoint)" in sli, window
        burn = recorded(f"kvwatch:canary_slo_burn:rate{window}")["expr"]
        assert f"kvwatch:canary_sli:ratio_rate{window}" in burn, window
        assert "kvwatch:canary_slo:objective" in burn, window


def test_the_sli_counts_healthy_verdicts_over_all_but_the_inconclusive_and_bisect() -> None:
    """The numerator is HEALTHY, the denominator leaves out INCONCLUSIVE and bisect probes."""
    for window in WINDOWS:
        expr = recorded(f"kvwatch:canary_sli:ratio_rate{window}")["expr"]
        assert matched_verdicts(expr, "=~") == HEALTHY, window
        assert matched_verdicts(expr, "!~") == INCONCLUSIVE, window
        assert expr.count('probe!="bisect"') == expr.count("kvwatch_probes_total"), window


def test_the_objective_is_one_recorded_constant() -> None:
    """kvwatch:canary_slo:objective is a plain number below 1, the only place it is written."""
    expr = recorded("kvwatch:canary_slo:objective")["expr"]
    objective = float(re.fullmatch(r"vector\(([0-9.]+)\)", expr.strip()).group(1))  # type: ignore[union-attr]
    assert 0 < objective < 1
    others = [r["expr"] for r in slo_rules() if r.get("record") != "kvwatch:canary_slo:objective"]
    assert not any(str(objective) in e for e in others)


def test_the_burn_rate_alerts_are_the_workbook_table() -> None:
    """Four alerts: 14.4x over 1h & 5m and 6x over 6h & 30m page, 3x and 1x open tickets."""
    seen = set()
    for rule in (r for r in slo_rules() if "alert" in r):
        assert rule["alert"] == "KVWatchCanaryErrorBudgetBurn"
        labels = rule["labels"]
        long, short = labels["long"], labels["short"]
        factors = re.findall(r"kvwatch:canary_slo_burn:rate(\w+) > ([0-9.]+)", rule["expr"])
        assert sorted(factors) == sorted([(long, factors[0][1]), (short, factors[0][1])])
        seen.add((long, short, float(factors[0][1]), labels["severity"]))
    assert seen == BURN_ALERTS
