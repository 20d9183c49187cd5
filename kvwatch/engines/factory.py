"""Build the engine adapter an endpoint's configuration asks for."""

from __future__ import annotations

import httpx

from kvwatch.canary.sizing import AcceptanceRule
from kvwatch.engines.base import Engine
from kvwatch.engines.openai import OpenAIEngine

# Each engine's own admission rule (DESIGN §1). llama.cpp's server accepts any prompt below
# n_ctx and cuts the answer short; the others reject prompt + max_tokens > window.
_RULES: dict[str, AcceptanceRule] = {
    "llamacpp": AcceptanceRule.PROMPT_BELOW_WINDOW,
}

FLAVOURS = ("openai", "vllm", "sglang", "llamacpp", "tgi", "ollama", "anthropic")


def build_engine(
    *,
    flavour: str,
    url: str,
    model: str,
    api_key: str | None,
    body_limit_bytes: int,
    client: httpx.AsyncClient,
) -> Engine:
    """An adapter for one endpoint. Every flavour speaks the OpenAI-compatible API for now;
    the flavour is recorded so engine-specific discovery can key on it."""
    if flavour not in FLAVOURS:
        raise ValueError(
            f"unknown engine flavour {flavour!r}: expected one of {', '.join(FLAVOURS)}"
        )
    return OpenAIEngine(
        client,
        base_url=url,
        model=model,
        api_key=api_key,
        body_limit_bytes=body_limit_bytes,
        rule=_RULES.get(flavour, AcceptanceRule.PROMPT_PLUS_MAX_TOKENS),
        flavour=flavour,
    )
