"""One cheap request that shows how an endpoint counts a canary-like prompt.

An estimating counter (``tokenizer: usage``, ``tiktoken:``, ``hf:``) learns the engine's
count from it before the first boundary canary is sized (the runner), and ``check-config
--live`` shows the two counts side by side. Not a probe: it judges nothing and is not stored.
"""

from __future__ import annotations

import random
import secrets
from dataclasses import dataclass

from kvwatch.canary import markers
from kvwatch.canary.counting import TokenCounter
from kvwatch.canary.model import Exchange, ProbeKind, Rejection
from kvwatch.canary.planning import plan_prompt
from kvwatch.engines.base import Engine
from kvwatch.engines.limits import stated_prompt_tokens

# Size of the request, in estimated tokens (at most half the window): large enough that the
# canary's fixed text is a small part of it, small enough to cost next to nothing beside a
# boundary canary.
MEASURE_TOKENS = 4096


@dataclass(frozen=True, slots=True)
class Measurement:
    planned: int  # what the counter estimated
    reported: int | None  # what the engine counted (usage, or a rejection's stated count)
    exchange: Exchange


def engine_count(exchange: Exchange) -> int | None:
    """The prompt tokens the engine says it counted: its usage, or what a context-length
    rejection states."""
    if exchange.prompt_tokens is not None:
        return exchange.prompt_tokens
    return exchange.stated_prompt_tokens


def read_stated_count(exchange: Exchange) -> None:
    """Fill in the prompt count a context-length rejection states, where it states one."""
    if exchange.error_body and exchange.rejection is Rejection.CONTEXT_LENGTH:
        exchange.stated_prompt_tokens = stated_prompt_tokens(exchange.error_body)


async def measure(
    engine: Engine, counter: TokenCounter, *, window: int, timeout: float
) -> Measurement:
    """Send a short prompt built like a canary (same filler, one token of answer)."""
    plan = await plan_prompt(
        ProbeKind.BASELINE,
        counter=counter,
        target_tokens=max(1, min(MEASURE_TOKENS, window // 2)),
        marker=markers.new_marker(),
        max_tokens=1,
        rng=random.Random(secrets.randbits(64)),
    )
    exchange = await engine.chat(plan.messages, max_tokens=1, stream=False, timeout=timeout)
    read_stated_count(exchange)
    return Measurement(plan.planned_tokens, engine_count(exchange), exchange)
