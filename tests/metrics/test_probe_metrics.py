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
    _observe_on(ProbeMetrics(registry), verdict)
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


def _observe_on(metrics: ProbeMetrics, verdict: Verdict) -> None:
    metrics.observe(
        endpoint="ol",
        kind="over",
        verdict=verdict,
        finished_at=AT,
        duration=0.5,
        planned=4097,
        reported=4096,
        completion=1,
    )


def test_the_last_verdict_gauge_shows_only_the_latest_verdict() -> None:
    """After pass, then marker_missing, then throttled, then pass: one verdict series at 1
    (throttled keeps the last real one), every other verdict's series present at 0."""
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    shown = []
    for verdict in (Verdict.PASS, Verdict.MARKER_MISSING, Verdict.THROTTLED, Verdict.PASS):
        _observe_on(metrics, verdict)
        ones = [
            v
            for v in Verdict
            if registry.get_sample_value(
                "kvwatch_probe_last_verdict", {**LABELS, "verdict": v.value}
            )
            == 1.0
        ]
        shown.append(ones)
    assert shown == [
        [Verdict.PASS],
        [Verdict.MARKER_MISSING],
        [Verdict.MARKER_MISSING],
        [Verdict.PASS],
    ]
    zeros = [
        v
        for v in Verdict
        if registry.get_sample_value("kvwatch_probe_last_verdict", {**LABELS, "verdict": v.value})
        == 0.0
    ]
    assert len(zeros) == len(Verdict) - 1
    assert (
        registry.get_sample_value("kvwatch_probes_total", {**LABELS, "verdict": Verdict.PASS.value})
        == 2.0
    )


def test_a_forgotten_endpoint_gets_its_series_back_when_probed_again() -> None:
    """Removing an endpoint drops its series; re-adding and probing it exports fresh ones
    (a cached child of a removed series would be written but never scraped)."""
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    _observe_on(metrics, Verdict.MARKER_MISSING)
    metrics.forget_endpoint("ol", "m", "vllm", ["over"])
    assert registry.get_sample_value("kvwatch_probe_success", LABELS) is None
    _observe_on(metrics, Verdict.PASS)
    assert registry.get_sample_value("kvwatch_probe_success", LABELS) == 1.0
    assert (
        registry.get_sample_value(
            "kvwatch_probe_last_verdict", {**LABELS, "verdict": Verdict.PASS.value}
        )
        == 1.0
    )
    assert (
        registry.get_sample_value(
            "kvwatch_probe_last_verdict", {**LABELS, "verdict": Verdict.MARKER_MISSING.value}
        )
        == 0.0
    )


def _every_sample(registry: CollectorRegistry) -> list[tuple[str, dict[str, str]]]:
    return [(s.name, s.labels) for family in registry.collect() for s in family.samples]


def test_a_removed_endpoint_leaves_no_series_behind() -> None:
    """After forget_endpoint no sample of any metric names the endpoint, the other
    endpoint's stay, and the per-endpoint caches and children are back to the other's."""
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    for endpoint in ("ol", "kept"):
        metrics.register_endpoint(
            endpoint, "m", "vllm", {"over": 60.0, "under": 60.0}, budget=(1000, 800)
        )
        for kind in ("over", "under"):
            for verdict in (Verdict.PASS, Verdict.MARKER_MISSING):
                metrics.observe(
                    endpoint=endpoint,
                    kind=kind,
                    verdict=verdict,
                    finished_at=AT,
                    duration=0.5,
                    planned=4097,
                    reported=4096,
                    completion=1,
                )
            metrics.observe_cross_tenant_leak(
                endpoint=endpoint, kind=kind, source_tenant="a", tenant="b", at=AT
            )
    with_both = metrics.sizes()

    metrics.forget_endpoint("ol", "m", "vllm", ["over", "under"])

    left = [(name, labels) for name, labels in _every_sample(registry) if labels.get("endpoint")]
    assert left and all(labels["endpoint"] == "kept" for _, labels in left)
    assert {name for name, _ in left} >= {
        "kvwatch_probe_duration_seconds_bucket",
        "kvwatch_probes_total",
        "kvwatch_probe_failures_total",
        "kvwatch_canary_tokens_total",
        "kvwatch_endpoint_info",
        "kvwatch_cross_tenant_leak_timestamp_seconds",
        "kvwatch_canary_budget_tokens",
    }
    assert metrics.budget_of("ol") is None and metrics.budget_of("kept") == (1000, 800)
    halved = {name: size // 2 for name, size in with_both.items()}
    assert metrics.sizes() == halved


def test_forgetting_kinds_keeps_the_endpoint_info_series() -> None:
    """A reload that drops one probe kind removes that kind's series only: the endpoint's
    info series (same model, same flavour) and its other kind stay."""
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    metrics.register_endpoint("ol", "m", "vllm", {"over": 60.0, "under": 60.0})
    metrics.forget_kinds("ol", ["over"])
    info = {"endpoint": "ol", "model": "m", "flavour": "vllm"}
    assert registry.get_sample_value("kvwatch_endpoint_info", info) == 1.0
    assert registry.get_sample_value("kvwatch_probe_interval_seconds", LABELS) is None
    under = {"endpoint": "ol", "probe": "under"}
    assert registry.get_sample_value("kvwatch_probe_interval_seconds", under) == 60.0


def test_forgetting_the_burst_kind_drops_its_series_of_every_burst_verdict() -> None:
    """A burst probe dropped from `probes:` leaves no series: the burst verdicts included."""
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    metrics.register_endpoint("b", "m", "vllm", {"burst": 60.0, "under": 60.0})
    for kind, verdict in (
        ("burst", Verdict.BURST_LEAK),
        ("burst", Verdict.BURST_WRONG),
        ("under", Verdict.PASS),
    ):
        metrics.observe(
            endpoint="b",
            kind=kind,
            verdict=verdict,
            finished_at=AT,
            duration=0.5,
            planned=1024,
            reported=1030,
            completion=40,
        )
    metrics.forget_kinds("b", ["burst"])
    probes = {labels.get("probe") for _, labels in _every_sample(registry) if labels.get("probe")}
    assert probes == {"under"}


def test_an_endpoints_budget_is_read_as_last_registered_and_agrees_with_its_gauge() -> None:
    """budget_of gives what the gauge exports: replaced by a reload, gone with the budget."""
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)

    def gauge(kind: str) -> float | None:
        labels = {"endpoint": "ol", "type": kind}
        return registry.get_sample_value("kvwatch_canary_budget_tokens", labels)

    metrics.register_endpoint("ol", "m", "vllm", {"under": 60.0}, budget=(5000, 4200))
    assert metrics.budget_of("ol") == (5000, 4200) and (gauge("budget"), gauge("planned")) == (
        5000.0,
        4200.0,
    )
    metrics.register_endpoint("ol", "m", "vllm", {"under": 60.0}, budget=(6000, None))
    assert metrics.budget_of("ol") == (6000, None) and gauge("planned") is None
    metrics.register_endpoint("ol", "m", "vllm", {"under": 60.0})
    assert metrics.budget_of("ol") is None and gauge("budget") is None
