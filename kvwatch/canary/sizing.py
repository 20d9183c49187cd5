"""How big each probe's prompt must be, by the engine's own acceptance rule (DESIGN §1)."""

from __future__ import annotations

import enum

from kvwatch.canary.model import ProbeKind


class AcceptanceRule(enum.StrEnum):
    # vLLM, SGLang, OpenAI: a request is rejected when prompt + max_tokens > window.
    PROMPT_PLUS_MAX_TOKENS = "prompt_plus_max_tokens"
    # llama.cpp server: rejected when prompt >= n_ctx (per slot); a prompt below n_ctx is
    # accepted even if the answer then has no room and is cut short.
    PROMPT_BELOW_WINDOW = "prompt_below_window"
    # Ollama: nothing is refused. Its runner reads a prompt of up to num_ctx tokens whole and
    # cuts a longer one to num_ctx (the first num_keep tokens and the tail: runner.go
    # NewSequence, `len(inputs) > numCtx`), so *over* is window + 1, the smallest prompt cut.
    PROMPT_UP_TO_WINDOW = "prompt_up_to_window"


class SizingError(ValueError):
    pass


def served_window(
    window: int, *, rule: AcceptanceRule, max_prompt_tokens: int | None, max_tokens: int
) -> int:
    """The window to probe when the engine also caps the prompt alone (TGI's max_input_tokens).

    TGI refuses ``prompt > max_input_tokens`` before it checks ``prompt + max_tokens`` against
    ``max_total_tokens``. Its defaults once were 1,024 and 2,048, so sizing by the total alone
    planned an under probe the engine must refuse and paged a healthy endpoint. The window
    returned puts both probes at the cap that binds first.
    """
    if max_prompt_tokens is None:
        return window
    if rule is AcceptanceRule.PROMPT_PLUS_MAX_TOKENS:
        return min(window, max_prompt_tokens + max_tokens)
    if rule is AcceptanceRule.PROMPT_UP_TO_WINDOW:
        return min(window, max_prompt_tokens)
    return min(window, max_prompt_tokens + 1)


def largest_accepted(rule: AcceptanceRule, *, window: int, max_tokens: int) -> int:
    """The largest prompt an engine with ``rule`` must accept in ``window`` when asked for
    ``max_tokens``: the *over* probe is one token more."""
    if rule is AcceptanceRule.PROMPT_PLUS_MAX_TOKENS:
        return window - max_tokens
    if rule is AcceptanceRule.PROMPT_UP_TO_WINDOW:
        return window
    return window - 1


def target_prompt_tokens(
    kind: ProbeKind,
    *,
    rule: AcceptanceRule,
    window: int,
    max_tokens: int,
    baseline_tokens: int,
    margin: int = 0,
) -> int:
    """Prompt tokens a probe of ``kind`` must carry.

    *under* is the largest prompt that leaves room for the answer on every engine:
    ``prompt + max_tokens = window`` (minus ``margin`` when the count is only estimated).
    *over* is the smallest prompt the engine must reject by its own rule (on an engine with
    no hard limit, the smallest prompt it must cut).
    *baseline* is short and fixed.
    """
    if window <= 0 or max_tokens <= 0:
        raise SizingError("window and max_tokens must be positive")
    if kind is ProbeKind.BASELINE:
        return min(baseline_tokens, max(1, window - max_tokens - margin))
    if kind is ProbeKind.UNDER:
        size = window - max_tokens - margin
        if size <= 0:
            raise SizingError(f"max_tokens {max_tokens} leaves no room for a prompt in {window}")
        return size
    if kind is not ProbeKind.OVER:
        raise SizingError(f"{kind} probes are not sized by the window (see edge_prompt_tokens)")
    return largest_accepted(rule, window=window, max_tokens=max_tokens) + 1 + margin


def edge_prompt_tokens(
    *,
    rule: AcceptanceRule,
    window: int,
    pool: int,
    max_tokens: int,
    margin: int = 0,
) -> int:
    """Prompt tokens of the *edge* probe: the smallest prompt the KV pool cannot hold.

    It only exists while the pool is smaller than the window: a prompt of ``pool + 1`` tokens
    is then inside the advertised window yet too large for the cache that must hold it — the
    gap where an engine either rejects or silently serves something else. SGLang rejects it
    by its scheduler limit (``min(context_len, max_total_num_tokens) - 1``); an engine that
    answers must answer from the whole prompt. Plan it like *over* (at least this many).
    """
    if window <= 0 or pool <= 0 or max_tokens <= 0:
        raise SizingError("window, pool and max_tokens must be positive")
    size = pool + 1 + margin
    over = target_prompt_tokens(
        ProbeKind.OVER, rule=rule, window=window, max_tokens=max_tokens, baseline_tokens=1
    )
    if size >= over:
        raise SizingError(
            f"no gap between the KV pool ({pool}) and the window ({window}) with "
            f"max_tokens {max_tokens}: the over probe already covers it"
        )
    return size
