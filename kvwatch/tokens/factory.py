"""Build the token counter an endpoint's ``tokenizer`` setting names."""

from __future__ import annotations

from kvwatch.canary.counting import TokenCounter
from kvwatch.engines.base import Engine
from kvwatch.tokens.local import HFTokenizerCounter, TiktokenCounter
from kvwatch.tokens.server import PieceCache, ServerTokenCounter
from kvwatch.tokens.usage import UsageCalibratedCounter

SPEC_HELP = "server | usage | tiktoken:<encoding> | hf:<tokenizer.json>"


def build_counter(
    tokenizer_spec: str, engine: Engine, piece_cache: PieceCache | None = None
) -> TokenCounter:
    if tokenizer_spec == "server":
        return ServerTokenCounter(engine, piece_cache)
    if tokenizer_spec == "usage":
        return UsageCalibratedCounter()
    kind, sep, arg = tokenizer_spec.partition(":")
    if sep and arg:
        if kind == "tiktoken":
            return TiktokenCounter(arg)
        if kind == "hf":
            return HFTokenizerCounter(arg)
    raise ValueError(f"unknown tokenizer {tokenizer_spec!r}: expected {SPEC_HELP}")
