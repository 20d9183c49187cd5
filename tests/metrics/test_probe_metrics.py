"""Per-probe metrics in a private registry: what a healthy and a failing verdict set."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry

from kvwatch.canary.model import Verdict
from kvwatch.metrics import ProbeMetrics

AT = datetime(2026, 12, 3, 5, 0, tzinfo=UTC)
LABELS = {"endpoint": "ol", "probe": "over"}


def _observe(verdict: Verdict) -> CollectorRegistry:
    registry = CollectorRegistry()
    ProbeMetrics(registry).observe(
        endpoint="ol",
        kind="over",
        verdict=verdict,
        finished_at=AT,
        duration=0.5,
        planned=4097,
        reported=4096,
        completion=1,
    )
    return registry


@pytest.mark.parametrize(
    ("verdict", "success", "failures"),
    [
        (Verdict.PASS, 1.0, None),
        (Verdict.OVER_TRUNCATED, 1.0, None),
        (Verdict.OVER_ACCEPTED, 0.0, 1.0),
    ],
)
def test_over_truncated_counts_as_a_healthy_probe(
    verdict: Verdict, success: float, failures: float | None
) -> None:
    """An engine's documented cut (over_truncated) keeps kvwatch_probe_success at 1 and is
    not counted as a failure; over_accepted is both."""
    registry = _observe(verdict)
    assert registry.get_sample_value("kvwatch_probe_success", LABELS) == success
    failed = registry.get_sample_value(
        "kvwatch_probe_failures_total", {**LABELS, "verdict": verdict.value}
    )
    assert failed == failures
    verdict_labels = {**LABELS, "verdict": verdict.value}
    assert registry.get_sample_value("kvwatch_probe_last_verdict", verdict_labels) == 1.0
