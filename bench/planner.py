"""Planner benchmark: kvwatch's count-pieces-then-verify planner vs a naive binary search.

Both plan under and over canaries of 131,072 and 1,048,576 tokens against the simulator's
real ``/tokenize`` endpoint over loopback HTTP (same tokenizer, same run). The naive planner
binary-searches the filler length, re-tokenizing the whole prompt at every step. Reported:
wall time and full-prompt tokenize calls for each, their ratio, and (for kvwatch's plan) the
planned vs reported prompt tokens of actually sending the under canary.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Sequence

import httpx

from bench.machine import describe
from kvwatch.canary import filler, markers
from kvwatch.canary.model import Message, ProbeKind
from kvwatch.canary.planning import Layout, plan_prompt
from kvwatch.canary.sizing import AcceptanceRule, target_prompt_tokens
from kvwatch.engines.openai import OpenAIEngine
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import SimEndpoint
from kvwatch.tokens.server import ServerTokenCounter

WINDOWS = (131_072, 1_048_576)
MAX_TOKENS = 32
REPEATS = 3


class CountingCounter:
    """Wraps the server counter to count full-prompt tokenize calls for both planners."""

    def __init__(self, inner: ServerTokenCounter) -> None:
        self.inner = inner
        self.source = inner.source
        self.exact = inner.exact
        self.calls = 0

    async def count_prompt(self, messages: Sequence[Message]) -> int:
        self.calls += 1
        return await self.inner.count_prompt(messages)

    async def count_pieces(self, pieces: Sequence[str]) -> list[int]:
        return await self.inner.count_pieces(pieces)

    def tolerance(self, planned: int) -> int:
        return self.inner.tolerance(planned)

    def observe(self, planned: int, reported: int) -> None:
        self.inner.observe(planned, reported)


async def naive_plan(
    counter: CountingCounter, target: int, marker: str, *, at_least: bool
) -> tuple[int, tuple[Message, ...]]:
    """Binary search over the number of filler pieces, tokenizing the whole prompt each step."""
    rng = random.Random(7)
    stream = filler.sentences(rng)
    pieces: list[str] = []
    # Generous upper bound: every piece is at least one token.
    while len(pieces) < target:
        pieces += next(stream)
    layout = Layout(marker, 0.0)
    lo, hi = 0, len(pieces)
    best: tuple[int, tuple[Message, ...]] | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        messages = layout.messages(pieces[:mid])
        n = await counter.count_prompt(messages)
        if n == target:
            return n, messages
        if n < target:
            if not at_least:
                best = (n, messages)
            lo = mid + 1
        else:
            if at_least:
                best = (n, messages)
            hi = mid - 1
    assert best is not None
    return best


async def run() -> None:
    print(f"# planner benchmark — {describe()}")
    print(f"# median of {REPEATS} runs; tokenize = full-prompt /tokenize calls over HTTP")
    header = (
        f"{'window':>9} {'kind':>5} {'kvwatch s':>10} {'calls':>5} "
        f"{'naive s':>8} {'calls':>5} {'speed-up':>8} {'planned':>9} {'reported':>9} {'diff':>4}"
    )
    print(header)
    endpoints = [SimEndpoint(f"w{w}", window=w) for w in WINDOWS]
    async with run_simulator(endpoints) as sim, httpx.AsyncClient(timeout=None) as client:
        for window in WINDOWS:
            name = f"w{window}"
            engine = OpenAIEngine(client, base_url=sim.url_for(name), model="sim-1", api_key=None)
            counter = CountingCounter(ServerTokenCounter(engine))
            for kind in (ProbeKind.UNDER, ProbeKind.OVER):
                target = target_prompt_tokens(
                    kind,
                    rule=AcceptanceRule.PROMPT_PLUS_MAX_TOKENS,
                    window=window,
                    max_tokens=MAX_TOKENS,
                    baseline_tokens=1536,
                )
                ours_t, ours_calls, naive_t, naive_calls = [], [], [], []
                plan = None
                for i in range(REPEATS):
                    counter.calls = 0
                    t0 = time.perf_counter()
                    plan = await plan_prompt(
                        kind,
                        counter=counter,
                        target_tokens=target,
                        marker=markers.new_marker(),
                        max_tokens=MAX_TOKENS,
                        rng=random.Random(i),
                    )
                    ours_t.append(time.perf_counter() - t0)
                    ours_calls.append(plan.tokenize_calls)
                    assert plan.planned_tokens == target, (plan.planned_tokens, target)
                    counter.calls = 0
                    t0 = time.perf_counter()
                    await naive_plan(
                        counter, target, markers.new_marker(), at_least=kind is ProbeKind.OVER
                    )
                    naive_t.append(time.perf_counter() - t0)
                    naive_calls.append(counter.calls)
                assert plan is not None
                reported = "-"
                diff = "-"
                if kind is ProbeKind.UNDER:
                    ex = await engine.chat(
                        plan.messages, max_tokens=MAX_TOKENS, stream=True, timeout=600
                    )
                    reported = str(ex.prompt_tokens)
                    diff = str((ex.prompt_tokens or 0) - plan.planned_tokens)
                ours = statistics.median(ours_t)
                naive = statistics.median(naive_t)
                print(
                    f"{window:>9} {kind.value:>5} {ours:>10.2f} {statistics.median(ours_calls):>5} "
                    f"{naive:>8.2f} {statistics.median(naive_calls):>5} {naive / ours:>7.1f}x "
                    f"{plan.planned_tokens:>9} {reported:>9} {diff:>4}"
                )


def main() -> None:
    asyncio.run(run())
