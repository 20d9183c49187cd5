"""What one /metrics scrape costs at fleet scale (issue 25).

A Prometheus scrape renders every series kvwatch exports. Its transient Python objects are
allocated in a web worker thread while the event loop allocates too, so their number is a
suspect for RSS that creeps although kvwatch's own maps stay the same size (the Memory
section of the README). This builds the per-endpoint series exactly as the daemon does
(:class:`kvwatch.metrics.ProbeMetrics`, every endpoint and kind observed once, so each has
all its children) and renders them as ``GET /metrics`` does (:func:`kvwatch.exposition.render`)
and, for comparison, with prometheus_client's ``generate_latest`` (which it replaced):

* the median time of ``--repeat`` renders of each (CPU on the thread that serves the scrape);
* the size of the body and its lines, and the families with the most lines;
* the peak of Python allocations during one render of each (tracemalloc; traced separately,
  so the timing is not slowed by it).

``python -m bench scrape --endpoints 1000`` is the fleet of the memory runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc
from collections import Counter
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, generate_latest

from bench.machine import describe
from kvwatch.canary.model import Verdict
from kvwatch.exposition import render
from kvwatch.metrics import ProbeMetrics

KINDS = ("under", "over", "baseline")
SUFFIXES = ("_bucket", "_count", "_sum", "_created", "_total")
TOP_FAMILIES = 8


def registry_for(endpoints: int) -> CollectorRegistry:
    """The series of ``endpoints`` endpoints, each kind of KINDS probed once."""
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    now = datetime.now(UTC)
    for i in range(endpoints):
        name = f"endpoint-{i:05d}"
        metrics.register_endpoint(name, "sim-1", "vllm", dict.fromkeys(KINDS, 60.0))
        for kind in KINDS:
            metrics.observe(
                endpoint=name,
                kind=kind,
                verdict=Verdict.PASS,
                finished_at=now,
                duration=0.1,
                planned=1000,
                reported=1000,
                completion=10,
            )
    return registry


def family(line: str) -> str:
    """The family a sample line belongs to (its name without a histogram or counter suffix)."""
    name = line.split("{", 1)[0].split(" ", 1)[0]
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix) + (" (_created)" if suffix == "_created" else "")
    return name


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench scrape", description=__doc__)
    parser.add_argument("--endpoints", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    opts = parser.parse_args(argv)
    if opts.repeat < 1 or opts.endpoints < 0:
        parser.error("--repeat must be at least 1 and --endpoints at least 0")
    print(f"# scrape — {describe()}")
    registry = registry_for(opts.endpoints)
    body = render(registry)
    if body != generate_latest(registry):
        raise SystemExit("kvwatch's render and generate_latest disagree: see tests/metrics")
    for renderer in (render, generate_latest):
        seconds = []
        for _ in range(opts.repeat):
            started = time.perf_counter()
            renderer(registry)
            seconds.append(time.perf_counter() - started)
        tracemalloc.start()
        renderer(registry)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        print(
            f"{renderer.__module__}.{renderer.__name__}: median "
            f"{statistics.median(seconds) * 1000:.0f} ms of {opts.repeat}; transient peak of "
            f"Python allocations {peak / 1e6:.1f} MB ({peak / len(body):.1f} x the body)"
        )
    lines = [line for line in body.decode().splitlines() if not line.startswith("#")]
    print(
        f"{opts.endpoints} endpoints x {len(KINDS)} kinds: body {len(body) / 1e6:.1f} MB, "
        f"{len(lines)} sample lines"
    )
    print("| family | lines |\n|---|---|")
    for name, count in Counter(map(family, lines)).most_common(TOP_FAMILIES):
        print(f"| {name} | {count} |")


if __name__ == "__main__":
    main()
