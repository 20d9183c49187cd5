"""Calibration benchmark: how close estimated canaries land to the boundary, cycle by cycle.

For each estimating tokenizer mode (``usage``; ``tiktoken:`` and ``hf:`` with a vocabulary
built here, offline, that is not the engine's), against simulated engines that count 4 %
more, 4 % fewer, and drifting, it runs cycles of baseline, under and over probes through the
real runner, store and simulator, from an empty database, and reports after cycles 1, 2
and 5:

- *under gap*: how far below the largest prompt the engine accepts the under probe landed,
  in the engine's own count, as a percentage of the window (0 is the boundary itself);
- *over refused*: the share of runs whose over probe was refused (it reached the limit);
- critical verdicts and sizing misses over all runs (a healthy engine must have none of the
  first).

Medians over several runs, each from an uncalibrated start.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client import CollectorRegistry

from bench.machine import describe
from kvwatch.canary.model import SEVERITY, ProbeKind, Severity, Verdict
from kvwatch.config import parse_config
from kvwatch.daemon import build_targets
from kvwatch.metrics import ProbeMetrics
from kvwatch.probe.runner import ProbeRunner
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import SimEndpoint
from kvwatch.store.engine import create_engine_for
from kvwatch.store.migrate import upgrade_engine
from kvwatch.store.repository import Store

WINDOW = 32_768
MAX_TOKENS = 32
CYCLES = 5
REPORT_AFTER = (1, 2, 5)
RUNS = 5
ENGINES = {
    "+4%": {"token_skew": 0.04},
    "-4%": {"token_skew": -0.04},
    "drifting": {"token_skew": 0.04, "token_skew_drift": -0.5},
}


def _local_tokenizers(folder: Path) -> dict[str, str]:
    """tokenizer specs of the local modes, built offline: an HF BPE trained on other text."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    text = (
        "The harbour master kept a ledger of every ship that came and went, noting the "
        "weather, the cargo and the names of the crew. "
    ) * 50
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(
        [text], trainer=trainers.BpeTrainer(vocab_size=400, special_tokens=["[UNK]"])
    )
    path = folder / "tokenizer.json"
    tok.save(str(path))
    # tiktoken's encodings are downloaded on first use; a byte-level one is built here (the
    # config names it as usage, and the counter is swapped in: see one_run).
    return {"usage": "usage", "tiktoken": "usage", "hf": f"hf:{path}"}


def _byte_encoding() -> Any:
    """A byte-level BPE with a handful of merges, built offline: a vocabulary far from the
    engine's (about one token per character)."""
    import tiktoken

    ranks = {bytes([i]): i for i in range(256)}
    for merge in (b"th", b"he", b"the", b" t", b"in", b"er", b"an", b" a"):
        ranks[merge] = len(ranks)
    return tiktoken.Encoding(
        name="bench_bytes",
        pat_str=r"""'s|'t|'re|'ve|'m|'ll|'d| ?\w+| ?\d+| ?[^\s\w]+|\s+""",
        mergeable_ranks=ranks,
        special_tokens={},
    )


async def one_run(mode: str, spec: str, engine: str, folder: Path, run: int) -> dict[str, object]:
    name = "gw"
    endpoints = [SimEndpoint(name, window=WINDOW, **ENGINES[engine])]  # type: ignore[arg-type]
    db = folder / f"{mode}-{list(ENGINES).index(engine)}-{run}.db"
    url = f"sqlite:///{db}"
    upgrade_engine(create_engine_for(url))
    store = Store(create_engine_for(url))
    gaps: dict[int, float] = {}
    refused: dict[int, bool] = {}
    critical = misses = 0
    async with run_simulator(endpoints) as sim, httpx.AsyncClient(timeout=120) as client:
        doc = {
            "database": url,
            "endpoints": [
                {
                    "name": name,
                    "url": sim.url_for(name),
                    "model": "sim-1",
                    "context_window": WINDOW,
                    "tokenizer": spec,
                    "max_tokens": MAX_TOKENS,
                }
            ],
        }
        config = parse_config(yaml.safe_dump(doc), source="<bench>")
        metrics = ProbeMetrics(CollectorRegistry())
        [target] = build_targets(config.resolved_endpoints(), store, lambda _: client, metrics)
        if mode == "tiktoken":
            from kvwatch.tokens.local import TiktokenCounter

            encoding = _byte_encoding()
            # Target is frozen: a copy with the local counter (the same endpoint state).
            target = dataclasses.replace(
                target, counter=TiktokenCounter("bench_bytes", encoding=encoding)
            )
        runner = ProbeRunner(store=store, metrics=metrics, replica="bench")
        limit = WINDOW - MAX_TOKENS
        for cycle in range(1, CYCLES + 1):
            for kind in (ProbeKind.BASELINE, ProbeKind.UNDER, ProbeKind.OVER):
                reports = await runner.run_checked(target, kind)
                critical += sum(SEVERITY[r.verdict] is Severity.CRITICAL for r in reports)
                misses += sum(r.verdict is Verdict.SIZING_MISS for r in reports)
                last = reports[-1]
                if kind is ProbeKind.UNDER and last.reported_prompt_tokens is not None:
                    gaps[cycle] = 100 * (limit - last.reported_prompt_tokens) / WINDOW
                if kind is ProbeKind.OVER:
                    refused[cycle] = last.verdict is Verdict.PASS
    store.engine.dispose()
    return {"gaps": gaps, "refused": refused, "critical": critical, "misses": misses}


def _median(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f}" if values else "-"


async def run() -> None:
    import structlog

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(40),  # errors only
    )
    print(f"calibration benchmark on {describe()}")
    print(
        f"window {WINDOW}, max_tokens {MAX_TOKENS}, {RUNS} runs per row from an empty database; "
        "under gap: median % of the window below the largest accepted prompt"
    )
    header = ["mode", "engine"]
    header += [f"gap@{c}" for c in REPORT_AFTER] + [f"refused@{c}" for c in REPORT_AFTER]
    header += ["critical", "sizing misses"]
    print(" | ".join(header))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for mode, spec in _local_tokenizers(folder).items():
            for engine in ENGINES:
                results = [await one_run(mode, spec, engine, folder, r) for r in range(RUNS)]
                row = [mode, engine]
                for c in REPORT_AFTER:
                    row.append(_median([r["gaps"][c] for r in results if c in r["gaps"]]))  # type: ignore[index,operator]
                for c in REPORT_AFTER:
                    hits = [r["refused"].get(c, False) for r in results]  # type: ignore[attr-defined]
                    row.append(f"{sum(hits)}/{len(hits)}")
                row.append(str(sum(r["critical"] for r in results)))  # type: ignore[misc]
                row.append(str(sum(r["misses"] for r in results)))  # type: ignore[misc]
                print(" | ".join(row))


def main() -> None:
    asyncio.run(run())


if __name__ == "__main__":
    main()
