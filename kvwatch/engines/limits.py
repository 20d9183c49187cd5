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
    if not body:
        return None
    text = body[:_MAX_SCAN_CHARS]
    try:
        payload: Any = json.loads(text)
    except ValueError:
        payload = None
    # llama.cpp puts the window beside the message as a number: exact, no parsing of prose.
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict) and error.get("type") == "exceed_context_size_error":
        n_ctx = error.get("n_ctx")
        if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0:
            return StatedLimit(n_ctx, Bound.PROMPT_BELOW)
    message = error_message(payload) if payload is not None else None
    for candidate in (message, text):
        if candidate is None:
            continue
        normal = " ".join(candidate.replace("\u2019", "'").split())
        for pattern, bound in _SHAPES:
            found = pattern.search(normal)
            if found:
                tokens = int(found.group(1).replace(",", ""))
                if tokens > 0:
                    return StatedLimit(tokens, bound)
    return None


def stated_prompt_tokens(body: str | None) -> int | None:
    """The prompt tokens an error body says the engine counted, or ``None``.

    That count is the engine's own: a plan sized by an estimate learns from it, and a
    rejected probe is judged by it (did the prompt really exceed the limit?).
    """
    if not body:
        return None
    text = body[:_MAX_SCAN_CHARS]
    try:
        payload: Any = json.loads(text)
    except ValueError:
        payload = None
    # llama.cpp states it as a number beside the message.
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        n_prompt = error.get("n_prompt_tokens")
        if isinstance(n_prompt, int) and not isinstance(n_prompt, bool) and n_prompt > 0:
            return n_prompt
    message = error_message(payload) if payload is not None else None
    for candidate in (message, text):
        if candidate is None:
            continue
        normal = " ".join(candidate.replace("\u2019", "'").split())
        for pattern in _COUNT_SHAPES:
            found = pattern.search(normal)
            if found:
                tokens = int(found.group(1).replace(",", ""))
                if tokens > 0:
                    return tokens
    return None
