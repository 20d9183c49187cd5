"""Build the engine adapter an endpoint's configuration asks for.

``flavour`` names the engine (whose discovery, tokenize dialect and admission rule apply);
``api`` names the wire API spoken to it, defaulting per flavour (docs/engines.md):

- ``chat``: OpenAI chat completions — openai, vllm, sglang, llamacpp, and tgi (its Messages API);
- ``completions``: OpenAI ``/v1/completions`` with a raw prompt — any OpenAI-compatible flavour;
- ``generate``: TGI's native ``/generate`` and ``/generate_stream`` — tgi only;
- ``native``: Ollama's ``/api/chat`` (ollama) and Anthropic's Messages API (anthropic), their
  only API here and their default.
"""

from __future__ import annotations

from typing import Any

import httpx

from kvwatch.canary.sizing import AcceptanceRule
from kvwatch.engines.anthropic import AnthropicEngine
from kvwatch.engines.base import Engine
from kvwatch.engines.completions import OpenAICompletionsEngine
from kvwatch.engines.llamacpp import LlamaCppEngine
from kvwatch.engines.ollama import OllamaEngine
from kvwatch.engines.openai import OpenAIEngine
from kvwatch.engines.sglang import SGLangEngine
from kvwatch.engines.tgi import TGIEngine, TGIGenerateEngine
from kvwatch.engines.vllm import VLLMEngine

FLAVOURS = ("openai", "vllm", "sglang", "llamacpp", "tgi", "ollama", "anthropic")
APIS = ("chat", "completions", "generate", "native")

DEFAULT_API = {
    "openai": "chat",
    "vllm": "chat",
    "sglang": "chat",
    "llamacpp": "chat",
    "tgi": "chat",
    "ollama": "native",
    "anthropic": "native",
}
SUPPORTED_APIS = {
    "openai": ("chat", "completions"),
    "vllm": ("chat", "completions"),
    "sglang": ("chat", "completions"),
    "llamacpp": ("chat", "completions"),
    "tgi": ("chat", "completions", "generate"),
    "ollama": ("native",),
    "anthropic": ("native",),
}

_CHAT_ENGINES: dict[str, type[OpenAIEngine]] = {
    "openai": OpenAIEngine,
    "vllm": VLLMEngine,
    "sglang": SGLangEngine,
    "llamacpp": LlamaCppEngine,
    "tgi": TGIEngine,
    "ollama": OllamaEngine,
    "anthropic": AnthropicEngine,
}
# Admission rule for the completions API, where the flavour's chat engine class is not used.
_RULES: dict[str, AcceptanceRule] = {"llamacpp": AcceptanceRule.PROMPT_BELOW_WINDOW}


def has_hard_limit(flavour: str) -> bool:
    """Whether the engine behind ``flavour`` refuses a prompt over its window (Ollama cuts it
    to fit instead); ``ValueError`` for an unknown flavour."""
    if flavour not in FLAVOURS:
        raise ValueError(f"unknown engine flavour {flavour!r}")
    # Every API of a flavour shares its engine's behaviour; the chat class is the one that
    # records it.
    return _CHAT_ENGINES[flavour].HARD_LIMIT


def build_engine(
    *,
    flavour: str,
    url: str,
    model: str,
    api_key: str | None,
    body_limit_bytes: int,
    client: httpx.AsyncClient,
    api: str | None = None,
) -> Engine:
    """An adapter for one endpoint; ``ValueError`` names what is wrong with the choice."""
    if flavour not in FLAVOURS:
        raise ValueError(
            f"unknown engine flavour {flavour!r}: expected one of {', '.join(FLAVOURS)}"
        )
    chosen = api or DEFAULT_API[flavour]
    if chosen not in SUPPORTED_APIS[flavour]:
        raise ValueError(
            f"api {chosen!r} is not available for flavour {flavour!r}: expected one of "
            f"{', '.join(SUPPORTED_APIS[flavour])}"
        )
    common: dict[str, Any] = {
        "base_url": url,
        "model": model,
        "api_key": api_key,
        "body_limit_bytes": body_limit_bytes,
    }
    if chosen == "completions":
        return OpenAICompletionsEngine(
            client,
            **common,
            rule=_RULES.get(flavour, AcceptanceRule.PROMPT_PLUS_MAX_TOKENS),
            flavour=flavour,
            tokenize_shape="llamacpp" if flavour == "llamacpp" else None,
        )
    if chosen == "generate":
        return TGIGenerateEngine(client, **common)
    if flavour == "openai":
        return OpenAIEngine(client, **common, flavour="openai")
    return _CHAT_ENGINES[flavour](client, **common)
