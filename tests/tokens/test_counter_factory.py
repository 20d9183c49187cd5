"""build_counter: the tokenizer setting names one counter."""

from __future__ import annotations

import httpx
import pytest

from kvwatch.engines.openai import OpenAIEngine
from kvwatch.tokens.factory import build_counter
from kvwatch.tokens.server import ServerTokenCounter
from kvwatch.tokens.usage import UsageCalibratedCounter


async def test_it_builds_the_server_and_usage_counters() -> None:
    """ "server" counts with the engine, "usage" calibrates from reports."""
    async with httpx.AsyncClient() as client:
        engine = OpenAIEngine(client, base_url="http://h/v1", model="m", api_key=None)
        assert isinstance(build_counter("server", engine), ServerTokenCounter)
        assert isinstance(build_counter("usage", engine), UsageCalibratedCounter)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("sentencepiece", "unknown tokenizer 'sentencepiece': expected server | usage"),
        ("tiktoken:", "unknown tokenizer 'tiktoken:'"),
        ("hf:", "unknown tokenizer 'hf:'"),
        ("tiktoken:o9k_base", "unknown tiktoken encoding 'o9k_base'"),
        ("hf:/nonexistent/tokenizer.json", "cannot load tokenizer '/nonexistent/tokenizer.json'"),
    ],
)
async def test_it_refuses_a_bad_tokenizer_setting(spec: str, message: str) -> None:
    """Unknown kinds, empty arguments and unloadable files are errors that say which."""
    async with httpx.AsyncClient() as client:
        engine = OpenAIEngine(client, base_url="http://h/v1", model="m", api_key=None)
        with pytest.raises(ValueError, match=message.replace("|", r"\|")):
            build_counter(spec, engine)
