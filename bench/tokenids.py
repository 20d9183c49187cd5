"""What reading one tokenize reply costs: ``json.loads`` against
:func:`kvwatch.engines.tokenids.parse_tokenize_reply` (issue 25).

A vLLM ``/tokenize`` reply lists every token id of the prompt. For each size (the fleet's
prompts of a few thousand tokens, and a million-token canary) it prints the body's size,
the median time of ``--repeat`` parses of each way, and the peak of Python allocations
during one parse (tracemalloc; traced separately, so the timing is not slowed by it).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from bench.machine import describe
from kvwatch.engines.tokenids import parse_tokenize_reply

SIZES = (6_000, 1_000_000)


def vllm_reply(count: int, rng: random.Random) -> bytes:
    """A reply shaped as vLLM's (TokenizeResponse: count, max_model_len, tokens, token_strs)."""
    ids = [rng.randrange(1_000, 150_000) for _ in range(count)]
    body = {"count": count, "max_model_len": 1_048_576, "tokens": ids, "token_strs": None}
    return json.dumps(body).encode()


def measure(parse: Callable[[bytes], Any], raw: bytes, repeat: int) -> tuple[float, int]:
    """(median seconds, peak bytes) of ``parse(raw)``."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        parse(raw)
        times.append(time.perf_counter() - started)
    tracemalloc.start()
    try:
        parse(raw)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return statistics.median(times), peak


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench tokenids", description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    opts = parser.parse_args(argv)
    if opts.repeat < 1:
        parser.error("--repeat must be at least 1")
    print(f"# tokenids — {describe()}")
    rng = random.Random(25)
    print("| ids | body | json.loads: median, peak | parse_tokenize_reply: median, peak |")
    print("|---|---|---|---|")
    for count in SIZES:
        raw = vllm_reply(count, rng)
        payload, ids = parse_tokenize_reply(raw)
        assert ids == count and payload["count"] == count, (ids, count)
        whole = measure(json.loads, raw, opts.repeat)
        counted = measure(parse_tokenize_reply, raw, opts.repeat)
        print(
            f"| {count:,} | {len(raw) / 1e6:.2f} MB "
            f"| {whole[0] * 1e3:.2f} ms, {whole[1] / 1e6:.2f} MB "
            f"| {counted[0] * 1e3:.2f} ms, {counted[1] / 1e6:.2f} MB |"
        )
