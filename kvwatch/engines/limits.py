"""The limit a context-length rejection states, where the engine states one. Pure: no I/O.

The served-window search (:mod:`kvwatch.canary.served`) uses it as a *hint*: a 4xx that says
"the maximum context length is 681280 tokens" usually names the served limit, which saves a
bisection. It is never trusted alone (the search verifies every hint with probes), so a
message we misread costs a probe, not a wrong answer.

Each shape names the upstream source its wording comes from (see also
:mod:`kvwatch.engines.rejections`, which decides *whether* a body is a context-length error).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvwatch.canary.sizing import AcceptanceRule
from kvwatch.engines.rejections import error_message


class Bound(enum.Enum):
    """What the stated number bounds."""

    # The whole request, by the engine's acceptance rule (prompt + max_tokens <= N for vLLM,
    # SGLang, OpenAI, Anthropic; prompt < N for llama.cpp).
    WINDOW = "window"
    TOTAL = "total"  # prompt + max_tokens <= N, whatever the engine's rule
    PROMPT_BELOW = "prompt_below"  # prompt < N
    PROMPT_AT_MOST = "prompt_at_most"  # prompt <= N


@dataclass(frozen=True, slots=True)
class StatedLimit:
    tokens: int
    bound: Bound

    def largest_prompt(self, *, rule: AcceptanceRule, max_tokens: int) -> int:
        """The largest prompt this limit admits for a request asking ``max_tokens``."""
        bound = self.bound
        if bound is Bound.WINDOW:
            bound = (
                Bound.TOTAL if rule is AcceptanceRule.PROMPT_PLUS_MAX_TOKENS else Bound.PROMPT_BELOW
            )
        if bound is Bound.TOTAL:
            return self.tokens - max_tokens
        if bound is Bound.PROMPT_BELOW:
            return self.tokens - 1
        return self.tokens


_N = r"(\d[\d,]*)"
_SHAPES: tuple[tuple[re.Pattern[str], Bound], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), bound)
    for pattern, bound in (
        # TGI router/src/validation.rs: ValidationError::MaxTotalTokens "`inputs` tokens +
        # `max_new_tokens` must be <= N" (input + max_new_tokens > N is refused) and
        # ValidationError::InputLength "`inputs` must have less than N tokens", raised when
        # input_length > max_input_length: despite "less than", a prompt of N is admitted.
        (r"`inputs` tokens \+ `max_new_tokens` must be <= " + _N, Bound.TOTAL),
        (r"`inputs` must have less than " + _N + r" tokens", Bound.PROMPT_AT_MOST),
        # SGLang validate_input_length (python/sglang/srt/managers/utils.py): refused when
        # the input has >= max_req_input_len tokens: "... exceeds the maximum allowed length
        # (M tokens)".
        (r"exceeds the maximum allowed length \(" + _N + r" tokens\)", Bound.PROMPT_BELOW),
        # llama.cpp server (tools/server): "request (N tokens) exceeds the available context
        # size (M tokens)", refused when the prompt has >= n_ctx tokens.
        (r"exceeds the available context size \(" + _N + r" tokens\)", Bound.PROMPT_BELOW),
        # OpenAI and vLLM (serving_engine.py and successors): "This model's maximum context
        # length is N tokens." — prompt + max_tokens must fit N.
        (r"maximum context length is " + _N, Bound.TOTAL),
        # vLLM get_max_tokens: "Input length (N) exceeds model's maximum context length (M)."
        (r"exceeds model's maximum context length \(" + _N + r"\)", Bound.WINDOW),
        # SGLang TokenizerManager: "The input (N tokens) is longer than the model's context
        # length (M tokens)." and "... exceeds the model's maximum context length of M tokens".
        (r"longer than the model's context length \(" + _N + r" tokens\)", Bound.WINDOW),
        (r"exceeds the model's maximum context length of " + _N, Bound.TOTAL),
        # Anthropic: "prompt is too long: 208310 tokens > 200000 maximum" and "input length
        # and `max_tokens` exceed context limit: 188240 + 21333 > 200000".
        (r"prompt is too long: \d[\d,]* tokens > " + _N + r" maximum", Bound.WINDOW),
        (r"exceed context limit: \d[\d,]* \+ \d[\d,]* > " + _N, Bound.TOTAL),
    )
)

_MAX_SCAN_CHARS = 64 * 1024

# How many prompt tokens a context-length rejection says the engine counted. Each shape is
# the wording of the engine named beside it (the same sources as the limits above).
_COUNT_SHAPES: tuple[re.Pattern[str], ...] = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        # vLLM v0.18+ (renderers/params.py): "your prompt contains N input tokens" (not
        # "at least N": that is a bound it stopped counting at, not a count); earlier
        # releases: "your request has N input tokens".
        r"your prompt contains " + _N + r" input tokens",
        r"your request has " + _N + r" input tokens",
        # vLLM (older) and OpenAI: "you requested T tokens (N in the messages, M in the
        # completion)"; OpenAI without max_tokens: "your messages resulted in N tokens".
        r"\(" + _N + r" in the messages",
        r"your messages resulted in " + _N + r" tokens",
        # vLLM get_max_tokens: "Input length (N) exceeds model's maximum context length".
        r"input length \(" + _N + r"\) exceeds",
        # SGLang: "The input (N tokens) is longer than ..." and "... N tokens from the input
        # messages"; llama.cpp: "request (N tokens) exceeds the available context size".
        r"the input \(" + _N + r" tokens\)",
        _N + r" tokens from the input messages",
        r"request \(" + _N + r" tokens\) exceeds",
        # TGI: "Given: N `inputs` tokens and M `max_new_tokens`".
        r"given: " + _N + r" `inputs` tokens",
        # Anthropic: "prompt is too long: N tokens > M maximum" and "input length and
        # `max_tokens` exceed context limit: N + M > L".
        r"prompt is too long: " + _N + r" tokens",
        r"exceed context limit: " + _N + r" \+",
    )
)


def stated_limit(body: str | None) -> StatedLimit | None:
    """The limit an error body states, or ``None`` when it names none we can read."""
    error, texts = _read(body)
    # llama.cpp puts the window beside the message as a number: exact, no parsing of prose.
    if error is not None and error.get("type") == "exceed_context_size_error":
        n_ctx = _positive(error.get("n_ctx"))
        if n_ctx is not None:
            return StatedLimit(n_ctx, Bound.PROMPT_BELOW)
    found = _first_match([pattern for pattern, _ in _SHAPES], texts)
    if found is None:
        return None
    index, tokens = found
    return StatedLimit(tokens, _SHAPES[index][1])


def stated_prompt_tokens(body: str | None) -> int | None:
    """The prompt tokens an error body says the engine counted, or ``None``.

    That count is the engine's own: a plan sized by an estimate learns from it, and a
    rejected probe is judged by it (did the prompt really exceed the limit?).
    """
    error, texts = _read(body)
    # llama.cpp states it as a number beside the message.
    if error is not None:
        n_prompt = _positive(error.get("n_prompt_tokens"))
        if n_prompt is not None:
            return n_prompt
    found = _first_match(_COUNT_SHAPES, texts)
    return None if found is None else found[1]


def _read(body: str | None) -> tuple[dict[str, Any] | None, list[str]]:
    """An error body's ``error`` object, if it is JSON with one, and the texts to search:
    its message first, then the whole body, with white space and apostrophes normalised."""
    if not body:
        return None, []
    text = body[:_MAX_SCAN_CHARS]
    try:
        payload: Any = json.loads(text)
    except ValueError:
        payload = None
    error = payload.get("error") if isinstance(payload, dict) else None
    message = error_message(payload) if payload is not None else None
    texts = [" ".join(t.replace("\u2019", "'").split()) for t in (message, text) if t]
    return (error if isinstance(error, dict) else None), texts


def _first_match(patterns: Sequence[re.Pattern[str]], texts: list[str]) -> tuple[int, int] | None:
    """The first pattern (by index) to capture a positive number, and that number: each
    text in turn, every pattern on it, so the message is read before the rest of the body."""
    for text in texts:
        for index, pattern in enumerate(patterns):
            found = pattern.search(text)
            tokens = _positive(int(found.group(1).replace(",", ""))) if found else None
            if tokens is not None:
                return index, tokens
    return None


def _positive(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None
