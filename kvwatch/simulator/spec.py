"""What one simulated endpoint is: its advertised window, its KV pool, and how it misbehaves."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Literal

from kvwatch.simulator.tokenizer import MAX_SKEW

# Endpoint names become URL path segments; names starting with "_" are reserved for the
# control API (``/_sim/...``).
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class FaultMode(enum.StrEnum):
    """How an endpoint degrades. Each one reproduces a failure kvwatch must catch."""

    HEALTHY = "healthy"
    # A prompt over the KV pool is swapped for a one-token placeholder; decode attends over
    # pages left by earlier requests (other users' data) and answers 200. With several keys
    # (``tenant_keys``), the pages another tenant's requests left, when there are any.
    STALE_KV = "stale_kv"
    # A prompt over the KV pool silently keeps only its last / first ``kv_pool`` tokens.
    TRUNCATE_HEAD = "truncate_head"
    TRUNCATE_TAIL = "truncate_tail"
    # No admission check: an over-window prompt is answered from its first ``window`` tokens
    # (Ollama, which has none anyway: read whole instead of cut to the window).
    ACCEPT_OVER_LIMIT = "accept_over_limit"
    # A prompt over the KV pool fails mid-stream: 200, a role chunk, then an error frame.
    STREAM_ERROR_FRAME = "stream_error_frame"
    # An over-window prompt gets a generic 500 instead of a 400 context-length error.
    WRONG_STATUS = "wrong_status"
    # A prompt over the KV pool is rejected as if the window were the KV pool.
    WINDOW_NOT_SERVED = "window_not_served"
    # The model never recalls a marker: a weak model, not a broken boundary.
    NO_RECALL = "no_recall"
    THROTTLED = "throttled"
    SERVER_ERROR = "server_error"
    # With ``batch_mix_at`` or more requests in flight, each is answered with another's
    # answer (``batch_mix_how: swap``, vLLM #6023: prefix caching under concurrency returned
    # other requests' responses) or with its own answer carrying another's result (``mix``,
    # TensorRT-LLM #17964: at concurrency 8 every request diverged). All HTTP 200.
    BATCH_MIX = "batch_mix"
    # The prefix cache serves, past where a prompt departs from a cached one, the earlier
    # document's later pages: a colliding or stale entry (vLLM #6023, tenstorrent/vllm #415).
    # The answer carries the earlier document's facts. HTTP 200.
    PREFIX_COLLISION = "prefix_collision"
    # An aborted streamed request's half-filled pages enter the prefix cache and are reused
    # by the next request with the same prefix (SGLang PR #28374). HTTP 200.
    ABORT_REUSE = "abort_reuse"


class Flavour(enum.StrEnum):
    """Whose admission rule and error bodies the endpoint imitates."""

    # Rejects prompt + max_tokens > window with a 400 BadRequestError.
    VLLM = "vllm"
    # Rejects prompt >= n_ctx with a 400 exceed_context_size_error; a prompt below n_ctx is
    # accepted and its answer cut to the room left.
    LLAMACPP = "llamacpp"
    # Rejects prompt + max_tokens > window with a 400 context_length_exceeded.
    OPENAI = "openai"
    # Rejects prompt + max_tokens > window, and (its scheduler limit) any prompt of at least
    # min(window, kv_pool) - 1 tokens, with a 400; serves /get_server_info.
    SGLANG = "sglang"
    # Rejects prompt + max_tokens > window with a 422 validation error; serves /info and the
    # native /generate API.
    TGI = "tgi"
    # Never rejects: a prompt of window tokens or more is cut to its first 4 and last tokens
    # (Ollama's runner); serves /api/chat, /api/show, /api/ps.
    OLLAMA = "ollama"
    # Rejects prompt + max_tokens > window with a 400 "prompt is too long"; serves
    # /v1/messages and /v1/messages/count_tokens.
    ANTHROPIC = "anthropic"


ReportUsage = Literal["attended", "sent"]
BatchMixHow = Literal["swap", "mix"]
# TensorRT-LLM #17964: the divergence began at concurrency 8.
DEFAULT_BATCH_MIX_AT = 8


@dataclass(frozen=True, slots=True)
class SimEndpoint:
    """One virtual endpoint, served under ``/NAME/``.

    ``kv_pool`` is the number of tokens the endpoint's KV cache can hold for one request; it
    defaults to the window (a correctly sized deployment). Only the KV faults look at it.
    ``report_usage`` says what ``usage.prompt_tokens`` reports when a prompt was not processed
    whole: the tokens actually attended to, or (an engine that lies) the tokens sent.
    """

    name: str
    model: str = "sim-1"
    window: int = 8192
    kv_pool: int | None = None
    fault: FaultMode = FaultMode.HEALTHY
    report_usage: ReportUsage = "attended"
    api_key: str | None = None
    # More accepted keys, one per tenant: a request's key says whose it is (stale_kv serves
    # it another tenant's cached pages).
    tenant_keys: tuple[str, ...] = ()
    prefill_tokens_per_second: float = 0.0  # 0 = instant
    ttfb_delay: float = 0.0
    # A streamed answer's pace, as an engine decodes a token a step (0 = all at once): a
    # client that hangs up mid-answer is then seen mid-answer, by this engine or a proxy.
    decode_tokens_per_second: float = 0.0
    flavour: Flavour = Flavour.VLLM
    # TGI only: its prompt cap (default window - 1, as TGI sets it when not given).
    max_input_tokens: int | None = None
    # Its vocabulary counts this fraction more (or, negative, fewer) tokens than the
    # simulator's own for the same text, and moves by ``token_skew_drift`` per 1,000 requests
    # (another model's tokenizer; one redeployed with another): see tokenizer.Tokenizer.
    token_skew: float = 0.0
    token_skew_drift: float = 0.0
    # batch_mix: the requests in flight at which answers start to mix, and how they mix.
    batch_mix_at: int = DEFAULT_BATCH_MIX_AT
    batch_mix_how: BatchMixHow = "swap"
    # Automatic prefix caching (16-token blocks). False: a healthy engine started without it
    # (vLLM --no-enable-prefix-caching, SGLang --disable-radix-cache): nothing is cached.
    prefix_cache: bool = True
    # A small model on a healthy engine: it miscopies the marker (drops its last symbol) for
    # one prompt in this many (0: never), chosen by the prompt's text, so the same prompt
    # fails the same way every time, alone or in a batch, as at temperature 0 (Gemma 3 270M:
    # 2 of 240 burst prompts; docs/llamacpp-facts.md, "Burst task under batching").
    miscopy_every: int = 0

    def __post_init__(self) -> None:
        if not _NAME_RE.fullmatch(self.name):
            raise ValueError(
                f"endpoint name {self.name!r}: use letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        if self.window <= 0:
            raise ValueError(f"endpoint {self.name}: window must be a positive integer")
        if self.kv_pool is not None and self.kv_pool <= 0:
            raise ValueError(f"endpoint {self.name}: kv_pool must be a positive integer")
        if self.report_usage not in ("attended", "sent"):
            raise ValueError(f"endpoint {self.name}: report_usage must be 'attended' or 'sent'")
        if not -MAX_SKEW <= self.token_skew <= MAX_SKEW:
            raise ValueError(f"endpoint {self.name}: token_skew must be within ±{MAX_SKEW}")
        if min(self.prefill_tokens_per_second, self.ttfb_delay, self.decode_tokens_per_second) < 0:
            raise ValueError(f"endpoint {self.name}: latencies must not be negative")
        if self.batch_mix_at < 2:
            raise ValueError(f"endpoint {self.name}: batch_mix_at must be at least 2")
        if self.miscopy_every < 0:
            raise ValueError(f"endpoint {self.name}: miscopy_every must not be negative")
        if self.batch_mix_how not in ("swap", "mix"):
            raise ValueError(f"endpoint {self.name}: batch_mix_how must be 'swap' or 'mix'")
        object.__setattr__(self, "tenant_keys", tuple(self.tenant_keys))
        if any(not key for key in self.tenant_keys):
            raise ValueError(f"endpoint {self.name}: tenant keys must not be empty")
        # Coerce plain strings (from the CLI or YAML) into the enums, so comparisons hold.
        object.__setattr__(self, "fault", FaultMode(self.fault))
        object.__setattr__(self, "flavour", Flavour(self.flavour))
        if self.max_input_tokens is not None:
            if self.flavour is not Flavour.TGI:
                raise ValueError(f"endpoint {self.name}: max_input_tokens is for the tgi flavour")
            if not 0 < self.max_input_tokens < self.window:
                raise ValueError(
                    f"endpoint {self.name}: max_input_tokens must be positive and below the window"
                )

    @property
    def keys(self) -> tuple[str, ...]:
        """Every key the endpoint accepts; none means it asks for no credentials."""
        return ((self.api_key,) if self.api_key is not None else ()) + self.tenant_keys

    @property
    def input_limit(self) -> int:
        """TGI's max_input_tokens: the largest prompt it admits whatever max_new_tokens is."""
        return self.window - 1 if self.max_input_tokens is None else self.max_input_tokens

    @property
    def pool_tokens(self) -> int:
        return self.window if self.kv_pool is None else self.kv_pool
