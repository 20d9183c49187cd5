"""OpenAIEngine's tokenize dialects, discovery and the engine factory, against the simulator."""

from __future__ import annotations

import socket

import httpx
import pytest

from kvwatch.canary.sizing import AcceptanceRule
from kvwatch.engines.factory import build_engine
from kvwatch.engines.openai import EngineCallError, OpenAIEngine
from kvwatch.simulator import tokenizer
from kvwatch.simulator.model import render_chat
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import Flavour, SimEndpoint
from tests.engines.wire import canary_messages

PIECES = ["alpha beta", " gamma", "12345", "Supercalifragilistic words, here."]


@pytest.mark.parametrize(
    ("flavour", "shape"), [(Flavour.VLLM, None), (Flavour.LLAMACPP, "llamacpp")]
)
async def test_the_prompt_count_equals_the_usage_the_engine_reports(
    client: httpx.AsyncClient, marker: str, flavour: Flavour, shape: str | None
) -> None:
    """Both tokenize dialects count the templated prompt exactly as the chat reports it."""
    messages = canary_messages(marker, filler_words=300)
    async with run_simulator([SimEndpoint("e", flavour=flavour)]) as sim:
        engine = OpenAIEngine(
            client,
            base_url=sim.url_for("e"),
            model="sim-1",
            api_key=None,
            tokenize_shape=shape,  # type: ignore[arg-type]
        )
        counted = await engine.count_prompt_tokens(messages)
        ex = await engine.chat(messages, max_tokens=16, stream=False, timeout=30)
    assert counted is not None
    assert counted == ex.prompt_tokens
    assert engine.tokenize_shape == (shape or "vllm")


@pytest.mark.parametrize("shape", ["vllm", "llamacpp"])
async def test_raw_text_counts_match_the_engines_tokenizer(
    client: httpx.AsyncClient, shape: str
) -> None:
    """count_text_tokens returns one raw count per text, in order, in either dialect."""
    async with run_simulator([SimEndpoint("e")]) as sim:
        engine = OpenAIEngine(
            client,
            base_url=sim.url_for("e"),
            model="sim-1",
            api_key=None,
            tokenize_shape=shape,  # type: ignore[arg-type]
        )
        counts = await engine.count_text_tokens(PIECES * 5)
    assert counts == [tokenizer.count(p) for p in PIECES * 5]


async def test_the_text_dialect_is_detected_and_remembered(client: httpx.AsyncClient) -> None:
    """With no dialect configured the first call finds one and later calls reuse it."""
    async with run_simulator([SimEndpoint("e")]) as sim:
        engine = OpenAIEngine(client, base_url=sim.url_for("e"), model="sim-1", api_key=None)
        before = engine.tokenize_shape
        first = await engine.count_text_tokens(PIECES)
        second = await engine.count_text_tokens(PIECES[:1])
        calls = sim.stats()["e"]["tokenize_calls"]
    assert before is None
    assert engine.tokenize_shape == "vllm"
    assert first == [tokenizer.count(p) for p in PIECES]
    assert second == first[:1]
    assert calls == len(PIECES) + 1


async def test_tokenize_replies_are_not_held_to_the_chat_body_cap(
    client: httpx.AsyncClient, marker: str
) -> None:
    """A tokenize reply lists every token id (megabytes for a long prompt); it still counts
    when the chat body cap is tiny."""
    messages = canary_messages(marker, filler_words=500)
    async with run_simulator([SimEndpoint("e")]) as sim:
        engine = OpenAIEngine(
            client, base_url=sim.url_for("e"), model="sim-1", api_key=None, body_limit_bytes=64
        )
        counted = await engine.count_prompt_tokens(messages)
    assert counted == tokenizer.count(render_chat(messages))


async def test_an_engine_without_tokenize_gives_none(
    client: httpx.AsyncClient, marker: str
) -> None:
    """Where neither dialect answers (404s), the counts are None rather than a guess."""
    async with run_simulator([SimEndpoint("e")]) as sim:
        # An engine root the simulator does not serve: every helper route is a 404.
        engine = OpenAIEngine(
            client, base_url=f"{sim.base_url}/absent/v1", model="sim-1", api_key=None
        )
        assert await engine.count_prompt_tokens(canary_messages(marker)) is None
        assert await engine.count_text_tokens(PIECES) is None
    assert engine.tokenize_shape is None


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_an_unreachable_tokenize_endpoint_raises_a_one_line_error(
    client: httpx.AsyncClient, marker: str
) -> None:
    """A transport failure is not "no tokenize endpoint": it raises, without the API key."""
    engine = OpenAIEngine(
        client,
        base_url=f"http://127.0.0.1:{_closed_port()}/v1",
        model="m",
        api_key="sk-never-shown",
    )
    with pytest.raises(EngineCallError) as caught:
        await engine.count_prompt_tokens(canary_messages(marker))
    assert str(caught.value).startswith("POST http://127.0.0.1:")
    assert "connect" in str(caught.value)
    assert "sk-never-shown" not in str(caught.value)


async def test_discovery_reads_the_advertised_window(client: httpx.AsyncClient) -> None:
    """GET /models yields the model's max_model_len as the context window."""
    async with run_simulator([SimEndpoint("e", model="glm-x", window=131_072)]) as sim:
        named = await OpenAIEngine(
            client, base_url=sim.url_for("e"), model="glm-x", api_key=None
        ).discover()
        only = await OpenAIEngine(
            client, base_url=sim.url_for("e"), model="alias", api_key=None
        ).discover()
    assert named.context_window == 131_072
    assert named.model == "glm-x"
    assert named.kv_pool_tokens is None
    # A proxy alias that is not listed: the only model served is the one behind it.
    assert only.context_window == 131_072 and only.model == "glm-x"


async def test_discovery_never_raises_for_an_unreachable_engine(
    client: httpx.AsyncClient,
) -> None:
    """An unreachable engine yields an empty Discovery whose detail says why."""
    found = await OpenAIEngine(
        client, base_url=f"http://127.0.0.1:{_closed_port()}/v1", model="m", api_key=None
    ).discover()
    assert found.context_window is None
    assert found.detail is not None and "connect" in found.detail


async def test_discovery_reports_a_refusal_status(client: httpx.AsyncClient) -> None:
    """A 401 on /models is reported in the detail, not raised."""
    async with run_simulator([SimEndpoint("e", api_key="k")]) as sim:
        found = await OpenAIEngine(
            client, base_url=sim.url_for("e"), model="sim-1", api_key=None
        ).discover()
    assert found == type(found)(detail="GET /models answered 401")


@pytest.mark.parametrize(
    ("flavour", "rule"),
    [
        ("llamacpp", AcceptanceRule.PROMPT_BELOW_WINDOW),
        ("vllm", AcceptanceRule.PROMPT_PLUS_MAX_TOKENS),
        ("openai", AcceptanceRule.PROMPT_PLUS_MAX_TOKENS),
        ("sglang", AcceptanceRule.PROMPT_PLUS_MAX_TOKENS),
        ("tgi", AcceptanceRule.PROMPT_PLUS_MAX_TOKENS),
    ],
)
def test_the_factory_gives_each_flavour_its_acceptance_rule(
    client: httpx.AsyncClient, flavour: str, rule: AcceptanceRule
) -> None:
    """llama.cpp accepts any prompt below n_ctx; the others reject prompt + max_tokens > window."""
    engine = build_engine(
        flavour=flavour,
        url="http://h:8000/v1/",
        model="m",
        api_key=None,
        body_limit_bytes=1024,
        client=client,
    )
    assert engine.flavour == flavour
    assert engine.rule is rule
    assert isinstance(engine, OpenAIEngine)
    assert engine.base_url == "http://h:8000/v1"
    assert engine.root_url == "http://h:8000"


def test_the_factory_refuses_an_unknown_flavour(client: httpx.AsyncClient) -> None:
    """A flavour typo is an error naming the valid ones."""
    with pytest.raises(ValueError, match="unknown engine flavour 'vlm': expected one of openai"):
        build_engine(
            flavour="vlm",
            url="http://h/v1",
            model="m",
            api_key=None,
            body_limit_bytes=1,
            client=client,
        )
