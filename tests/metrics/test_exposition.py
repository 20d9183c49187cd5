"""kvwatch's /metrics renderer: the same bytes as prometheus_client's, without its peak."""

from __future__ import annotations

import tracemalloc
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from kvwatch.arenas import Heap
from kvwatch.canary.model import Verdict
from kvwatch.exposition import render
from kvwatch.metrics import (
    ConfigMetrics,
    DiscoveryMetrics,
    MallocCollector,
    ProbeMetrics,
    ServedWindowCollector,
    SizesCollector,
)

WHEN = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
# Label values that need the text format's escaping, and some that are not ASCII.
AWKWARD = ['quote"d', "back\\slash", "new\nline", "ünïcode-ü", "plain"]


@dataclass(frozen=True)
class Window:
    served_tokens: int
    advertised_tokens: int


def daemon_registry(endpoints: list[str]) -> CollectorRegistry:
    """Every family the daemon registers, with series for ``endpoints``."""
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    registry.register(ServedWindowCollector(lambda: {e: Window(1000, 2000) for e in endpoints[:2]}))
    registry.register(SizesCollector(lambda: {"targets": len(endpoints), "gates": 0}))
    registry.register(MallocCollector(lambda: Heap(allocated=10, free=2, mmapped=3)))
    ConfigMetrics(registry).loaded(WHEN)
    discovery = DiscoveryMetrics(registry)
    discovery.refreshed("fleet", len(endpoints), WHEN)
    discovery.failed("fleet", "unreachable")
    for i, endpoint in enumerate(endpoints):
        metrics.register_endpoint(endpoint, "m", "vllm", {"under": 60.0, "over": 60.0})
        for kind in ("under", "over"):
            metrics.observe(
                endpoint=endpoint,
                kind=kind,
                verdict=list(Verdict)[i % len(Verdict)],
                finished_at=WHEN,
                duration=0.25 * (i + 1),
                planned=1000 + i,
                reported=1000,
                completion=7,
            )
        metrics.observe_cross_tenant_leak(
            endpoint=endpoint, kind="under", source_tenant="a", tenant="b", at=WHEN
        )
    return registry


def test_the_daemons_registry_renders_byte_for_byte_as_prometheus_client_does() -> None:
    """Every family kvwatch exports, escaped label values included, matches generate_latest."""
    registry = daemon_registry(AWKWARD)
    assert render(registry) == generate_latest(registry)


def test_counters_and_histograms_keep_their_created_series_after_their_family() -> None:
    """OpenMetrics-only _created series come out as the client orders them."""
    registry = CollectorRegistry()
    Counter("c_total", "a counter", ("l",), registry=registry).labels("x").inc()
    Histogram("h_seconds", "a histogram", registry=registry).observe(0.3)
    Counter("bare", "no labels", registry=registry).inc(2)
    rendered = render(registry)
    assert b"c_created" in rendered
    assert rendered == generate_latest(registry)


def test_an_empty_registry_renders_nothing() -> None:
    """No collectors, no bytes (as the client)."""
    assert render(CollectorRegistry()) == generate_latest(CollectorRegistry()) == b""


def test_a_registry_with_target_info_is_left_to_prometheus_client() -> None:
    """target_info is a family collect() adds itself: the client renders it, so it is kept."""
    registry = CollectorRegistry(target_info={"service": "kvwatch"})
    Counter("c", "a counter", registry=registry).inc()
    rendered = render(registry)
    assert b"target_info" in rendered
    assert rendered == generate_latest(registry)


def test_rendering_holds_little_more_than_the_body_at_its_peak() -> None:
    """The client's renderer peaks at over three bodies of small objects; this one at
    about one body (the buffer) and a chunk of lines."""
    registry = daemon_registry([f"endpoint-{i:04d}" for i in range(150)])
    body = render(registry)
    peaks = []
    for renderer in (render, generate_latest):
        tracemalloc.start()
        renderer(registry)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    ours, theirs = peaks
    assert ours < 1.6 * len(body) < theirs / 2, (ours, theirs, len(body))
