"""The discovery metrics: what a refresh and a failure set, what forgetting a source drops,
and that the README names each series."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry

from kvwatch.metrics import DiscoveryMetrics

README = Path(__file__).parents[2] / "README.md"
WHEN = datetime(2026, 12, 4, 12, 0, tzinfo=UTC)


def series(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in registry.collect()
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def test_a_refresh_sets_the_count_and_success_and_a_failure_counts_by_reason() -> None:
    """The failure clears the success gauge and keeps the last count and time."""
    registry = CollectorRegistry()
    metrics = DiscoveryMetrics(registry)
    metrics.refreshed("fleet", 3, WHEN)
    metrics.failed("fleet", "unreachable")
    metrics.failed("fleet", "unreachable")
    src = (("source", "fleet"),)
    assert series(registry) == {
        ("kvwatch_discovery_endpoints", src): 3.0,
        ("kvwatch_discovery_last_refresh_successful", src): 0.0,
        ("kvwatch_discovery_last_refresh_success_timestamp_seconds", src): WHEN.timestamp(),
        (
            "kvwatch_discovery_refresh_failures_total",
            (("reason", "unreachable"), ("source", "fleet")),
        ): 2.0,
    }


def test_forgetting_a_source_drops_all_its_series_and_only_its() -> None:
    """A source removed by a reload leaves no stale series; the others stay."""
    registry = CollectorRegistry()
    metrics = DiscoveryMetrics(registry)
    for name in ("gone", "kept"):
        metrics.refreshed(name, 1, WHEN)
        metrics.failed(name, "invalid")
    metrics.forget("gone")
    assert {dict(labels)["source"] for _name, labels in series(registry)} == {"kept"}


def test_the_readme_names_every_discovery_series() -> None:
    """Each series the registry exports is documented."""
    registry = CollectorRegistry()
    metrics = DiscoveryMetrics(registry)
    metrics.refreshed("x", 1, WHEN)
    metrics.failed("x", "invalid")
    names = {name for name, _labels in series(registry)}
    assert len(names) == 4
    text = README.read_text(encoding="utf-8")
    assert [name for name in sorted(names) if name not in text] == []
