"""One probe end to end without the runner: engine → server token counter → plan → chat → judge."""

from __future__ import annotations

import random

import httpx

from kvwatch.canary.edge import judge_edge
from kvwatch.canary.markers import new_marker
from kvwatch.canary.model import Judgement, PlannedPrompt, ProbeKind
from kvwatch.canary.planning import plan_prompt
from kvwatch.canary.sizing import edge_prompt_tokens, target_prompt_tokens
from kvwatch.canary.verdicts import judge
from kvwatch.engines.base import Engine
from kvwatch.engines.factory import build_engine
from kvwatch.tokens.base import TokenCounter
from kvwatch.tokens.server import ServerTokenCounter
from tests.helpers.counters import SimCounter

MAX_TOKENS = 16


def engine_for(
    client: httpx.AsyncClient, url: str, flavour: str, api: str | None = None, model: str = "sim-1"
) -> Engine:
    return build_engine(
        flavour=flavour,
        url=url,
        model=model,
        api_key=None,
        body_limit_bytes=4 * 1024 * 1024,
        client=client,
        api=api,
    )


def counter_for(engine: Engine, *, raw_prompt: bool = False) -> TokenCounter:
    # Ollama has no tokenize endpoint: count locally with the simulator's own tokenizer and
    # template (what a configured hf: tokenizer is on a real deployment).
    if engine.flavour == "ollama" and not raw_prompt:
        return SimCounter()
    return ServerTokenCounter(engine)


async def run_probe(
    engine: Engine,
    kind: str,
    *,
    window: int,
    pool: int | None = None,
    stream: bool = False,
    counter: TokenCounter | None = None,
    baseline_tokens: int = 200,
) -> tuple[PlannedPrompt, Judgement]:
    """Plan and send one probe of ``kind`` (under/over/baseline/edge) and judge it."""
    counter = counter or counter_for(engine)
    if kind == "edge":
        assert pool is not None
        target = edge_prompt_tokens(
            rule=engine.rule, window=window, pool=pool, max_tokens=MAX_TOKENS
        )
        plan_kind = ProbeKind.OVER  # planned "at least", like over (see docs/engines.md)
    else:
        plan_kind = ProbeKind(kind)
        target = target_prompt_tokens(
            plan_kind,
            rule=engine.rule,
            window=window,
            max_tokens=MAX_TOKENS,
            baseline_tokens=baseline_tokens,
        )
    plan = await plan_prompt(
        plan_kind,
        counter=counter,
        target_tokens=target,
        marker=new_marker(),
        max_tokens=MAX_TOKENS,
        rng=random.Random(7),
        window=window,
    )
    exchange = await engine.chat(plan.messages, max_tokens=MAX_TOKENS, stream=stream, timeout=60)
    if kind == "edge":
        judgement = judge_edge(plan, exchange)
    else:
        # As the runner does: an engine without a hard limit is judged on its cut.
        cut_to = None if engine.hard_limit else window
        judgement = judge(plan, exchange, truncates_to=cut_to)
    return plan, judgement
