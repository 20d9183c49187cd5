"""The vocabulary shared by every layer: probe kinds, verdicts and the raw facts of a probe.

Nothing here does I/O. An engine adapter fills an :class:`Exchange` with what it saw on the
wire; :mod:`kvwatch.canary.verdicts` turns an exchange plus the plan into a :class:`Verdict`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime


class ProbeKind(enum.StrEnum):
    UNDER = "under"
    OVER = "over"
    BASELINE = "baseline"
    # The engine's self-report: discovered window vs KV pool (no prompt is sent).
    CAPACITY = "capacity"
    # Just over the KV pool, inside the window: run by the capacity check when an engine
    # reports a pool smaller than its window (the gap where the incident happened).
    EDGE = "edge"
    # A step of the served-window search after a window failure (kvwatch.canary.served):
    # evidence linked to its trigger, never scheduled, never paging.
    BISECT = "bisect"
    # The same short canary sent concurrently: a solo request, then N at once, each with its
    # own marker and a checkable task (kvwatch.canary.burst): the batch path of the engine.
    BURST = "burst"
    # A document of planted facts sent cold, then again so the engine serves it from its
    # prefix cache (warm, a branch sharing its first part, reuse after an abort), each answer
    # checked (kvwatch.canary.cache): the cache-hit path of the engine.
    CACHE = "cache"


class Verdict(enum.StrEnum):
    PASS = "pass"
    MARKER_MISSING = "marker_missing"
    FOREIGN_MARKER = "foreign_marker"
    # A marker issued under one tenant's credentials in an answer given to another tenant.
    CROSS_TENANT_LEAK = "cross_tenant_leak"
    OVER_ACCEPTED = "over_accepted"
    # over, on an engine with no hard limit (Ollama): the prompt was cut to fit the window,
    # as the engine documents, and the answer leaked nothing. Expected, and never a page.
    OVER_TRUNCATED = "over_truncated"
    TRUNCATED = "truncated"
    UNDER_REJECTED = "under_rejected"
    WRONG_REJECTION = "wrong_rejection"
    STREAM_ERROR = "stream_error"
    CANARY_INEFFECTIVE = "canary_ineffective"
    CAPACITY_MISMATCH = "capacity_mismatch"
    ERROR = "error"
    AUTH_ERROR = "auth_error"
    THROTTLED = "throttled"
    # A probe planned by an estimate whose size, in the engine's own count, missed the
    # boundary it was meant to test (an over probe that fit, an under probe that did not):
    # it proves nothing either way. Re-planned with what it taught, and never a page.
    SIZING_MISS = "sizing_miss"
    # burst: an answer holds the marker of another request of the same burst (the engine
    # mixed up concurrent requests: one user's answer carries another's data).
    BURST_LEAK = "burst_leak"
    # burst: a request answered its task wrong under load while the solo request was right.
    BURST_WRONG = "burst_wrong"
    # cache: a step the engine served from its prefix cache answered wrong while the cold
    # request and two controls re-asked with no cache hit possible were right.
    CACHE_CORRUPT = "cache_corrupt"
    # cache: the warm step shows no cache hit (0 or not reported): the hit path was not
    # tested. Says so instead of passing; never pages.
    CACHE_NOT_EXERCISED = "cache_not_exercised"


class Severity(enum.StrEnum):
    CRITICAL = "critical"
    WARNING = "warning"
    # Worth showing, never worth a page or a ticket: what the engine can do is all it did.
    INFO = "info"
    NONE = "none"


SEVERITY: dict[Verdict, Severity] = {
    Verdict.PASS: Severity.NONE,
    Verdict.MARKER_MISSING: Severity.CRITICAL,
    Verdict.FOREIGN_MARKER: Severity.CRITICAL,
    Verdict.CROSS_TENANT_LEAK: Severity.CRITICAL,
    Verdict.OVER_ACCEPTED: Severity.CRITICAL,
    Verdict.OVER_TRUNCATED: Severity.INFO,
    Verdict.TRUNCATED: Severity.CRITICAL,
    Verdict.UNDER_REJECTED: Severity.WARNING,
    Verdict.WRONG_REJECTION: Severity.WARNING,
    Verdict.STREAM_ERROR: Severity.WARNING,
    Verdict.CANARY_INEFFECTIVE: Severity.WARNING,
    Verdict.CAPACITY_MISMATCH: Severity.CRITICAL,
    # DESIGN §2: an error pages only as a streak (KVWatchProbeFailing), never on its own.
    Verdict.ERROR: Severity.WARNING,
    Verdict.AUTH_ERROR: Severity.WARNING,
    Verdict.THROTTLED: Severity.NONE,
    Verdict.SIZING_MISS: Severity.NONE,
    Verdict.BURST_LEAK: Severity.CRITICAL,
    # Critical: the solo request proved the model does the task, so wrong answers under load
    # are the engine corrupting its batch (TensorRT-LLM #17964: at concurrency 8 every
    # request diverged, all HTTP 200), served to every user of it. The usual confirmation
    # probe (a fresh burst, new tasks) keeps a one-off flip of a batch-variant model from
    # paging anyone.
    Verdict.BURST_WRONG: Severity.CRITICAL,
    # Critical: the same model answered the same question right without the cache (cold, and
    # the control that bypasses it), so the wrong answer is the engine serving wrong KV.
    Verdict.CACHE_CORRUPT: Severity.CRITICAL,
    Verdict.CACHE_NOT_EXERCISED: Severity.INFO,
}

# Verdicts that say nothing about the endpoint's correctness (retry later, or re-plan): they
# leave alert state and the success gauge as they were.
INCONCLUSIVE: frozenset[Verdict] = frozenset(
    {Verdict.THROTTLED, Verdict.SIZING_MISS, Verdict.CACHE_NOT_EXERCISED}
)

# What a healthy endpoint answers: pass, or, for the over probe of an engine that truncates
# instead of refusing, the truncation it documents. These keep `kvwatch probe` at exit 0,
# set kvwatch_probe_success to 1 and clear alerts; anything else is a finding.
HEALTHY: frozenset[Verdict] = frozenset({Verdict.PASS, Verdict.OVER_TRUNCATED})


class ProbeState(enum.StrEnum):
    """Lifecycle of a stored probe row: written as RUNNING before the request goes out."""

    RUNNING = "running"
    DONE = "done"
    INTERRUPTED = "interrupted"


class TransportError(enum.StrEnum):
    """Why no (complete) HTTP answer arrived."""

    CONNECT = "connect"
    TIMEOUT = "timeout"
    READ = "read"  # connection dropped mid-body
    TOO_LARGE = "too_large"  # body exceeded the read cap
    PROTOCOL = "protocol"  # TLS, bad HTTP, redirect loop...


class Rejection(enum.StrEnum):
    """How an error body reads, as recognised by the engine adapter."""

    CONTEXT_LENGTH = "context_length"
    OTHER = "other"


@dataclass(frozen=True, slots=True)
class Message:
    role: str
    content: str


@dataclass(slots=True)
class Exchange:
    """Raw facts of one request/response, as an engine adapter saw them. No judgement here."""

    status: int | None = None  # HTTP status; None when transport failed before one arrived
    transport_error: TransportError | None = None
    error_detail: str | None = None  # a human sentence explaining what went wrong, bounded
    answer: str | None = None  # assistant text; None when the body held none / was unparseable
    body_parsed: bool = False  # a 2xx body (or stream) was understood as a completion
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # usage reported by the engine
    completion_tokens: int | None = None
    # Prompt tokens the engine says it served from its prefix cache: OpenAI-compatible
    # ``usage.prompt_tokens_details.cached_tokens``, Anthropic ``cache_read_input_tokens``.
    # None when the engine did not say (vLLM omits the details unless started with
    # --enable-prompt-tokens-details, and when nothing was cached): absent is not 0.
    cached_prompt_tokens: int | None = None
    # The first usage count the engine sent that is no token count (negative, fractional, a
    # string, a bool, past any window), as "<field> <value as sent>"; its count is then None.
    unusable_usage: str | None = None
    streamed: bool = False
    stream_error_frame: bool = False  # an SSE frame carrying an error arrived on a 2xx stream
    stream_terminated: bool = False  # the stream ended with its terminator ([DONE] or engine's)
    # Events (SSE) or lines (NDJSON) the stream sent after its terminator, in the reads that
    # were made: never part of the answer or usage, kept as evidence of a stream that goes on.
    events_after_terminator: int = 0
    rejection: Rejection | None = None  # set for non-2xx bodies and error frames
    # The prompt tokens a context-length rejection says the engine counted, where it says.
    stated_prompt_tokens: int | None = None
    error_body: str | None = None  # the engine's error body, bounded
    ttfb_seconds: float | None = None
    total_seconds: float | None = None


@dataclass(frozen=True, slots=True)
class ForeignMarker:
    """A kvwatch marker found in an answer that was issued to another probe."""

    marker: str
    probe_id: int
    endpoint: str
    issued_at: datetime
    # The tenant (config name, never its key) whose credentials the probe was sent with;
    # None when it used the endpoint's own api_key.
    tenant: str | None = None


class DepthOutcome(enum.StrEnum):
    """What became of one marker of a prompt that carries one per depth (issue 12)."""

    FOUND = "found"  # recalled: the engine read this part of the prompt
    MISSING = "missing"  # not recalled
    # Not recalled, and the answer holds another probe's marker instead: the engine read
    # someone else's data where this part of the prompt should have been.
    FOREIGN = "foreign"


@dataclass(frozen=True, slots=True)
class Placement:
    """One marker planted at one depth (fraction of the filler before it)."""

    depth: float
    marker: str


@dataclass(frozen=True, slots=True)
class DepthResult:
    """A planted marker and whether the answer recalled it."""

    depth: float
    marker: str
    outcome: DepthOutcome


@dataclass(frozen=True, slots=True)
class PlannedPrompt:
    """A canary prompt sized for one probe, with how sure we are of its size."""

    kind: ProbeKind
    messages: tuple[Message, ...]
    marker: str
    planned_tokens: int
    target_tokens: int
    exact: bool  # planned_tokens verified by a tokenizer of the target (not estimated)
    tolerance: int  # tokens of slack when comparing planned and reported usage
    max_tokens: int
    tokenize_calls: int = 0  # full-prompt tokenize calls spent planning it
    # The window the probe was sized against: no engine that honours it reports reading more
    # (None: not known, e.g. a plan made outside the runner).
    window: int | None = None
    token_source: str = "server"
    marker_depth: float = 0.0  # fraction of the filler before the marker
    note: str | None = None  # what planning noticed about the target (added to a failure)
    # Every marker with its depth, shallowest first, when the prompt carries one per depth
    # (several ``marker_depths``); empty for the usual single marker (``marker`` above is
    # then the only one, and with several it is the first of these).
    placements: tuple[Placement, ...] = ()
    # The largest prompt the engine must accept by its own rule, for the window the probe
    # was sized against. Set for under and over probes: with an estimated plan, a verdict
    # about the boundary is drawn from the engine's count against it, not from the estimate.
    accepts_up_to: int | None = None
    # How many times this probe was re-planned after a sizing miss within its slot.
    attempt: int = 0

    @property
    def markers(self) -> tuple[str, ...]:
        """Every marker this prompt carries."""
        return tuple(p.marker for p in self.placements) or (self.marker,)


class BurstOutcome(enum.StrEnum):
    """What became of one request of a burst (kvwatch.canary.burst)."""

    RIGHT = "right"  # its own marker and its own word, nothing else
    WRONG = "wrong"  # its marker or its word missing or wrong
    LEAK = "leak"  # holds the marker of another request of the same burst
    FOREIGN = "foreign"  # holds the marker of another probe
    FAILED = "failed"  # no usable answer: transport, status, stream or body


@dataclass(frozen=True, slots=True)
class BurstRequest:
    """One request of a burst cycle as judged: the evidence stored with the probe."""

    index: int  # 0: the solo request; 1..N: the burst's members, in the order sent
    size: int  # requests sent at once with it (1: the solo request)
    marker: str
    expected: str  # the task's answer: the word the request was asked to give back
    outcome: BurstOutcome
    status: int | None = None
    marker_found: bool = False
    answered: str | None = None  # the task's word the answer gave (None: none of them)
    siblings: tuple[int, ...] = ()  # indexes of the other requests whose markers it holds
    foreign: tuple[int, ...] = ()  # ids of other probes whose markers it holds
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    detail: str | None = None  # why it failed, for a FAILED request
    answer: str | None = None  # the answer's text (bounded when stored)
    # Member ``index`` sent again alone after it answered wrong (kvwatch.canary.burst): its
    # control, size 1.
    control: bool = False


class CacheOutcome(enum.StrEnum):
    """What became of one step of a cache cycle (kvwatch.canary.cache)."""

    RIGHT = "right"  # the asked fact's code, and no other code
    WRONG = "wrong"  # the code missing, or another code of the cycle given
    FOREIGN = "foreign"  # holds the marker of another probe
    FAILED = "failed"  # no usable answer: transport, status, stream or body
    ABORTED = "aborted"  # the abort step: disconnected after its first chunk, as planned


@dataclass(frozen=True, slots=True)
class CacheStep:
    """One step of a cache cycle as judged: the evidence stored with the probe."""

    step: str  # cold, warm, branch, abort, reuse, return, control
    document: str  # which planted document it asked about (A, A', B, an earlier one's label)
    key: str  # the fact asked for
    expected: str  # the code planted for it
    outcome: CacheOutcome
    status: int | None = None
    cached_tokens: int | None = None  # what the engine said it served from cache (None: silent)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    code_found: bool = False
    # Other codes of the cycle the answer gave, as "<document> <key>" (a code of the wrong
    # fact, or of the document a cache served instead).
    answered: tuple[str, ...] = ()
    foreign: tuple[int, ...] = ()  # ids of other probes whose markers it holds
    detail: str | None = None
    answer: str | None = None  # the answer's text (bounded when stored)


@dataclass(frozen=True, slots=True)
class Judgement:
    """A verdict with the one-line reason and the facts it rests on."""

    verdict: Verdict
    reason: str
    marker_found: bool = False
    foreign: list[ForeignMarker] = field(default_factory=list)
    token_drift: int | None = None  # reported - planned, when both are known and believed
    # Per depth, when the prompt carried one marker per depth; empty otherwise.
    depths: list[DepthResult] = field(default_factory=list)
    # The foreign markers issued under another named tenant (a cross_tenant_leak's source).
    crossed: tuple[ForeignMarker, ...] = ()
    # Per request, for a burst probe; empty otherwise.
    burst: tuple[BurstRequest, ...] = ()
    # Per step, for a cache probe; empty otherwise.
    cache: tuple[CacheStep, ...] = ()
