"""Counting with the target's own tokenize endpoint: exact, template included."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from kvwatch.canary.model import Message
from kvwatch.engines.base import Engine, EngineAuthError, TokenizeUnavailable

# Filler pieces are words and short phrases drawn from a fixed vocabulary, so the cache stays
# small in practice; the cap only guards against a planner that sends unique pieces forever.
_CACHE_LIMIT = 200_000


class PieceCache:
    """Token counts of filler pieces, shared by the counters of endpoints serving one model.

    Sharing is safe even if two such endpoints tokenize differently: piece counts only steer
    the first draft of a prompt, and the full-prompt verification corrects any difference.
    The lock makes counting single-flight, so the probes starting together on a fresh
    process count the vocabulary once instead of once each.
    """

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.lock = asyncio.Lock()


class ServerTokenCounter:
    """Counts with the engine's tokenize endpoint. Piece counts are cached per piece, so the
    filler vocabulary is counted once per endpoint rather than once per probe; full-prompt
    counts are never cached (every canary is new) and are counted in ``prompt_calls``."""

    source = "server"
    exact = True

    def __init__(self, engine: Engine, cache: PieceCache | None = None) -> None:
        self._engine = engine
        self._cache = cache or PieceCache()
        self._pieces = self._cache.counts
        self.prompt_calls = 0
        self.piece_calls = 0  # pieces actually sent to the engine (cache misses)

    async def count_prompt(self, messages: Sequence[Message]) -> int:
        self.prompt_calls += 1
        try:
            count = await self._engine.count_prompt_tokens(messages)
        except EngineAuthError:
            raise
        except Exception as exc:  # transport failure: the planner must not guess instead
            raise TokenizeUnavailable(f"tokenize call failed: {exc}") from exc
        if count is None:
            raise TokenizeUnavailable(
                f"{self._engine.flavour} endpoint offers no tokenize endpoint (tried vLLM "
                "/tokenize and llama.cpp /apply-template + /tokenize); configure "
                "tokenizer: usage, tiktoken:<encoding> or hf:<tokenizer.json>"
            )
        return count

    async def count_pieces(self, pieces: Sequence[str]) -> list[int]:
        if all(p in self._pieces for p in pieces):
            return [self._pieces[p] for p in pieces]
        async with self._cache.lock:
            return await self._count_missing(pieces)

    async def _count_missing(self, pieces: Sequence[str]) -> list[int]:
        missing = list(dict.fromkeys(p for p in pieces if p not in self._pieces))
        if missing:
            try:
                counts = await self._engine.count_text_tokens(missing)
            except EngineAuthError:
                raise
            except Exception as exc:
                raise TokenizeUnavailable(f"tokenize call failed: {exc}") from exc
            if counts is None or len(counts) != len(missing):
                raise TokenizeUnavailable(
                    f"{self._engine.flavour} endpoint cannot tokenize raw text; configure "
                    "another tokenizer"
                )
            self.piece_calls += len(missing)
            fresh = dict(zip(missing, counts, strict=True))
            result = [fresh[p] if p in fresh else self._pieces[p] for p in pieces]
            if len(self._pieces) + len(fresh) > _CACHE_LIMIT:
                self._pieces.clear()
            self._pieces.update(fresh)
            return result
        return [self._pieces[p] for p in pieces]

    def tolerance(self, planned: int) -> int:
        return 0

    def observe(self, planned: int, reported: int) -> None:
        return None
