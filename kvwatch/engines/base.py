"""The engine interface: what kvwatch needs from any serving API.

An adapter speaks one API flavour over an ``httpx.AsyncClient`` it is given, and reports raw
facts (:class:`~kvwatch.canary.model.Exchange`). It never judges: verdicts are pure logic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvwatch.canary.model import Exchange, Message
from kvwatch.canary.sizing import AcceptanceRule

# Called with a short status line while a long request is in flight ("prefill 41 s").
ProgressCallback = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Discovery:
    """What an engine says about itself. ``None`` means "not reported"."""

    context_window: int | None = None
    kv_pool_tokens: int | None = None
    model: str | None = None
    detail: str | None = None
    # The largest prompt admitted whatever max_tokens is, when the engine has such a cap
    # below its window (TGI's max_input_tokens): the boundary to probe is then this one.
    max_prompt_tokens: int | None = None
    # What identifies the deployment beyond window, pool and model (engine version or build,
    # process start, weights): (field, value) pairs, sorted. Only facts whose change means a
    # redeploy belong here, never load or uptime (kvwatch.fingerprint).
    identity: tuple[tuple[str, str], ...] = ()


def identity_of(**fields: object) -> tuple[tuple[str, str], ...]:
    """The reported facts among ``fields`` as sorted (name, text) pairs; ``None``, empty and
    non-scalar values are left out (an engine that does not report a fact states nothing)."""
    pairs = []
    for name, value in fields.items():
        if isinstance(value, bool) or value is None or value == "":
            continue
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, str | int | float):
            pairs.append((name, str(value)))
    return tuple(sorted(pairs))


class Engine(Protocol):
    flavour: str
    rule: AcceptanceRule
    # False: the engine cuts an over-long prompt to its window instead of refusing it.
    hard_limit: bool

    async def chat(
        self,
        messages: Sequence[Message],
        *,
        max_tokens: int,
        stream: bool,
        timeout: float,
        progress: ProgressCallback | None = None,
        hang_up_after_first_chunk: bool = False,
    ) -> Exchange:
        """Send one chat request and report what came back. Never raises for HTTP/transport
        failures: they are facts recorded in the exchange. With ``hang_up_after_first_chunk``
        a streamed request is disconnected once its first chunk arrives (the engine aborts
        it), keeping what arrived."""
        ...

    async def count_prompt_tokens(self, messages: Sequence[Message]) -> int | None:
        """Prompt tokens of ``messages`` after the engine's chat template, by the engine's
        own tokenizer; ``None`` when the engine offers no way to count."""
        ...

    async def count_text_tokens(self, texts: Sequence[str]) -> list[int] | None:
        """Tokens of each raw text (no template, no special tokens); ``None`` if unsupported."""
        ...

    async def discover(self) -> Discovery: ...


class TokenizeUnavailable(Exception):
    """The engine has no usable tokenize endpoint (raised by server token counters)."""


class EngineAuthError(Exception):
    """The engine refused kvwatch's credentials (401/403) on a helper call such as tokenize.

    Kept apart from other helper failures so a bad API key is reported as ``auth_error``
    (a config problem) instead of as a missing tokenize endpoint."""
