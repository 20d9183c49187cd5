"""ServerTokenCounter over the simulator: exact prompt counts, cached pieces, clear failures."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from kvwatch.canary.markers import new_marker
from kvwatch.canary.model import Message
from kvwatch.engines.base import TokenizeUnavailable
from kvwatch.engines.openai import OpenAIEngine, TokenizeShape
from kvwatch.simulator import tokenizer
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import Flavour, SimEndpoint
from kvwatch.tokens.server import ServerTokenCounter


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as http:
        yield http


def _messages(words: int) -> list[Message]:
    filler = " ".join(f"harbour{i % 13} tide" for i in range(words))
    return [
        Message("system", "Repeat the code."),
        Message("user", f"Code: {new_marker()}. {filler} What was the code?"),
    ]


@pytest.mark.parametrize(
    ("flavour", "shape"), [(Flavour.VLLM, "vllm"), (Flavour.LLAMACPP, "llamacpp")]
)
async def test_count_prompt_equals_the_usage_the_engine_reports(
    client: httpx.AsyncClient, flavour: Flavour, shape: TokenizeShape
) -> None:
    """The server count of a prompt is the engine's reported usage.prompt_tokens, exactly."""
    async with run_simulator([SimEndpoint("e", flavour=flavour, window=16_384)]) as sim:
        engine = OpenAIEngine(
            client, base_url=sim.url_for("e"), model="sim-1", api_key=None, tokenize_shape=shape
        )
        counter = ServerTokenCounter(engine)
        for words in (1, 100, 2000):
            messages = _messages(words)
            counted = await counter.count_prompt(messages)
            ex = await engine.chat(messages, max_tokens=16, stream=True, timeout=30)
            assert counted == ex.prompt_tokens
    assert counter.prompt_calls == 3
    assert counter.exact and counter.source == "server"
    assert counter.tolerance(1_000_000) == 0


async def test_pieces_are_counted_once_per_endpoint(client: httpx.AsyncClient) -> None:
    """A repeated piece costs no second tokenize call: the vocabulary is counted once."""
    pieces = ["the tide", " turned", "slowly", " the tide"]
    async with run_simulator([SimEndpoint("e")]) as sim:
        engine = OpenAIEngine(client, base_url=sim.url_for("e"), model="sim-1", api_key=None)
        counter = ServerTokenCounter(engine)
        first = await counter.count_pieces(pieces)
        after_first = sim.stats()["e"]["tokenize_calls"]
        second = await counter.count_pieces([*pieces, "slowly", "new piece"])
        after_second = sim.stats()["e"]["tokenize_calls"]
    assert first == [tokenizer.count(p) for p in pieces]
    assert second == [*first, tokenizer.count("slowly"), tokenizer.count("new piece")]
    assert after_first == 4  # four distinct pieces
    assert after_second - after_first == 1  # only "new piece" was new
    assert counter.piece_calls == 5
    assert counter.prompt_calls == 0


async def test_an_engine_without_tokenize_raises_tokenize_unavailable(
    client: httpx.AsyncClient,
) -> None:
    """No tokenize endpoint: a clear error that names the alternatives, never a guess."""
    async with run_simulator([SimEndpoint("e")]) as sim:
        engine = OpenAIEngine(client, base_url=f"{sim.base_url}/absent/v1", model="m", api_key=None)
        counter = ServerTokenCounter(engine)
        with pytest.raises(TokenizeUnavailable, match="configure tokenizer: usage"):
            await counter.count_prompt(_messages(3))
        with pytest.raises(TokenizeUnavailable, match="cannot tokenize raw text"):
            await counter.count_pieces(["a"])


async def test_an_unreachable_engine_raises_tokenize_unavailable(
    client: httpx.AsyncClient,
) -> None:
    """A transport failure while counting surfaces as TokenizeUnavailable with the cause."""
    engine = OpenAIEngine(client, base_url="http://127.0.0.1:9/v1", model="m", api_key=None)
    with pytest.raises(TokenizeUnavailable, match="tokenize call failed: POST"):
        await ServerTokenCounter(engine).count_prompt(_messages(3))
