"""The simulated engine, pure: chat template, a deterministic "model", the KV page pool, faults.

:func:`decide` maps (endpoint state, request) to what the engine does: reject with a status and
body, fail mid-stream, or answer with text and usage. The HTTP layer only renders decisions.

The "model" is deliberately simple and honest about what it saw: it answers with the first
kvwatch marker in the tokens it *attended to*, or says it found none. So every fault that
changes what is attended (truncation, a placeholder over stale KV pages) changes the answer
exactly as it would on a real engine, and a stale page's marker leaks into someone else's
answer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvwatch.canary.markers import find_markers
from kvwatch.canary.model import Message
from kvwatch.simulator import errors, tokenizer
from kvwatch.simulator.errors import ErrorBody
from kvwatch.simulator.prefix import BLOCK_TOKENS, PrefixCache
from kvwatch.simulator.spec import FaultMode, Flavour, SimEndpoint
from kvwatch.simulator.traces import ReceivedTraces, kept_per_endpoint

# The release a simulated engine reports until a redeploy changes it.
SIM_VERSION = "0.0.0-kvwatch-sim"
NOT_FOUND = "I could not find a code in the text."
PAGE_TOKENS = 256
MAX_PAGES = 64
RETRY_AFTER_SECONDS = 7
# Tokens Ollama's runner keeps from the head of a truncated prompt (num_keep).
OLLAMA_KEEP = 4
# Faults that replace SGLang's scheduler limit with the failure they simulate.
_NO_POOL_GUARD = frozenset(
    {
        FaultMode.STALE_KV,
        FaultMode.TRUNCATE_HEAD,
        FaultMode.TRUNCATE_TAIL,
        FaultMode.STREAM_ERROR_FRAME,
        FaultMode.ACCEPT_OVER_LIMIT,
    }
)
# How a several-marker canary (kvwatch.canary.planning.MultiLayout) asks for its codes.
_ASKED_FOR = re.compile(r"(?:Remember|What are) the (\d+) codes")
# What a swapped-out prompt becomes: one token, which holds nothing worth recalling.
PLACEHOLDER_TOKENS = 1
# One step of an engine's running batch: requests that arrive within it are decoded together
# (what a batch_mix fault mixes), and a request stays in the batch a step after its answer.
BATCH_STEP_SECONDS = 0.2
# How a burst canary (kvwatch.canary.burst) plants the word it asks back.
_WORD_PLANTED = re.compile(r"Remember this animal: ([a-z]+)")
# The word an answer ends with: what a mixed batch takes from another request.
_LAST_WORD = re.compile(r"[a-z]+(?=[^a-z]*$)")
# How a cache canary (kvwatch.canary.cache) plants a fact and asks for one.
_FACT_ASKED = re.compile(r"What is the ([a-z]+) code\?")
_FACT = "The {key} code is "
# Flavours whose usage carries prompt_tokens_details.cached_tokens, 0 included: llama.cpp's
# server always (n_prompt_tokens_cache), SGLang with --enable-cache-report, OpenAI. vLLM
# writes it only when something was cached (and with --enable-prompt-tokens-details).
_REPORTS_ZERO_CACHED = frozenset({Flavour.LLAMACPP, Flavour.SGLANG, Flavour.OPENAI})


def render_chat(messages: Sequence[Message], *, add_generation_prompt: bool = True) -> str:
    """The simulator's chat template (ChatML), the text that is tokenized and counted."""
    parts = [f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in messages]
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


class KVPagePool:
    """The KV pages one endpoint keeps after serving requests, oldest first.

    Pages are fixed-size runs of tokens aligned on the start of each prompt, as in a paged KV
    cache. Only the most recent pages are kept: at most ``MAX_PAGES`` or the KV pool's worth,
    whichever is smaller. They are what a stale-KV fault attends to instead of the prompt.
    Each page remembers the tenant (the credential) whose request wrote it.
    """

    def __init__(self, kv_pool: int, *, page_tokens: int = PAGE_TOKENS) -> None:
        self.page_tokens = page_tokens
        self.max_pages = max(1, min(MAX_PAGES, kv_pool // page_tokens))
        self._pages: deque[tuple[str | None, str]] = deque(maxlen=self.max_pages)

    def write(self, text: str, n_tokens: int, *, tenant: str | None = None) -> None:
        """Store ``text`` (``n_tokens`` tokens) as ``tenant``'s pages; older pages fall out."""
        total_pages = -(-n_tokens // self.page_tokens)
        # Pages that would be evicted at once are never tokenized: a 1M-token prompt only
        # costs its tail.
        skip_pages = max(0, total_pages - self.max_pages)
        tail = text[tokenizer.char_offset(text, skip_pages * self.page_tokens) :]
        pieces = tokenizer.tokenize(tail)
        for start in range(0, len(pieces), self.page_tokens):
            self._pages.append((tenant, "".join(pieces[start : start + self.page_tokens])))

    def recent_first(self, *, not_of: str | None = None) -> str:
        """The pages' text, most recent page first: what a stale decode attends over.

        With ``not_of``, only pages another tenant wrote, when there are any: the incident's
        stale pages held *other customers'* requests. Without such pages (one identity, or
        only its own pages so far), every page.
        """
        pages = list(reversed(self._pages))
        if not_of is not None:
            others = [text for owner, text in pages if owner != not_of]
            if others:
                return "".join(others)
        return "".join(text for _owner, text in pages)

    def __len__(self) -> int:
        return len(self._pages)


@dataclass(frozen=True, slots=True)
class ChatRequest:
    messages: tuple[Message, ...]
    max_tokens: int | None
    stream: bool
    # A raw prompt (completions, TGI /generate) is read as is, without the chat template.
    raw_prompt: str | None = None
    # Who sent it: the credential presented (None without one). Its pages are its tenant's,
    # and a stale-KV fault serves it another tenant's.
    tenant: str | None = field(default=None, repr=False)

    def prompt_text(self) -> str:
        return render_chat(self.messages) if self.raw_prompt is None else self.raw_prompt


@dataclass(frozen=True, slots=True)
class Reject:
    """No answer: an HTTP error status with its body. Nothing was prefilled."""

    status: int
    body: ErrorBody
    headers: dict[str, str] = field(default_factory=dict)
    prefilled_tokens: int = 0


@dataclass(frozen=True, slots=True)
class StreamFailure:
    """A 200 stream that sends its role chunk, then an error frame, then ``[DONE]``."""

    error: ErrorBody
    prefilled_tokens: int


@dataclass(frozen=True, slots=True)
class Answer:
    pieces: tuple[str, ...]  # the answer's tokens, streamed one per chunk
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int  # what usage reports
    prefilled_tokens: int  # what was actually processed
    # The prefilled text, written to the KV pages once served (None: nothing worth keeping).
    prefilled_text: str | None
    # usage.prompt_tokens_details.cached_tokens as the engine reports it (None: not sent).
    cached_tokens: int | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def completion_tokens(self) -> int:
        return len(self.pieces)


Decision = Reject | StreamFailure | Answer
# What an admitted request gets: an answer, or a stream that fails.
Served = StreamFailure | Answer


@dataclass(slots=True)
class EndpointStats:
    requests: int = 0
    prefilled_tokens: int = 0
    rejected: int = 0
    tokenize_calls: int = 0
    # The most requests it has had in flight at once (a burst that reached it as one).
    peak_in_flight: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "requests": self.requests,
            "prefilled_tokens": self.prefilled_tokens,
            "rejected": self.rejected,
            "tokenize_calls": self.tokenize_calls,
            "peak_in_flight": self.peak_in_flight,
        }


@dataclass(eq=False, slots=True)
class InFlight:
    """A request being served, with what the engine decided for it alone."""

    decision: Served


class EndpointState:
    """One endpoint's mutable state: its current fault, KV pages and counters."""

    def __init__(self, spec: SimEndpoint) -> None:
        self.spec = spec
        self.fault = spec.fault
        self.pool = KVPagePool(spec.pool_tokens)
        self.stats = EndpointStats()
        self.prefix = PrefixCache(spec.pool_tokens // BLOCK_TOKENS)
        self._tokenizer = tokenizer.Tokenizer(spec.token_skew)
        # The requests being served now, in arrival order: the batch an engine steps.
        self.in_flight: list[InFlight] = []
        # What the engine says about itself beyond window and pool: its release and when its
        # process started. PUT /NAME/_sim/fingerprint changes them, as a redeploy would.
        self.version = SIM_VERSION
        self.started_at = round(time.time(), 3)
        self.deploys = 0

    def redeploy(self, version: str | None, *, restart: bool, now: float) -> None:
        """Change what the engine reports as a redeploy does: a new release, a new process."""
        if version is not None:
            self.version = version
        if restart:
            self.started_at = round(now, 3)
        self.deploys += 1

    @property
    def tokenizer(self) -> tokenizer.Tokenizer:
        """The vocabulary it counts with now (a drifting one moves with its requests)."""
        if self.spec.token_skew_drift:
            drifted = self.spec.token_skew + self.spec.token_skew_drift * (
                self.stats.requests / 1000
            )
            skew = round(max(-tokenizer.MAX_SKEW, min(tokenizer.MAX_SKEW, drifted)), 4)
            if skew != self._tokenizer.skew:
                self._tokenizer = tokenizer.Tokenizer(skew)
        return self._tokenizer

    def handle(self, request: ChatRequest) -> Decision:
        """Decide on ``request`` and record its effects (counters, KV pages)."""
        decision = decide(self.spec, self.fault, self.pool, request, self.tokenizer)
        if isinstance(decision, Answer) and decision.prefilled_text == request.prompt_text():
            decision = self._through_prefix_cache(request, decision)
        self.record(decision, tenant=request.tenant)
        return decision

    def _through_prefix_cache(self, request: ChatRequest, decision: Answer) -> Answer:
        """A prompt read whole, served through the prefix cache: the cached blocks' stored
        text is what the model attends to there, and usage says how much was cached."""
        if not self.spec.prefix_cache:
            return dataclasses.replace(decision, cached_tokens=self._reported(0))
        pieces = tokenizer.tokenize(decision.prefilled_text or "")
        hit = self.prefix.lookup(pieces, collide=self.fault is FaultMode.PREFIX_COLLISION)
        # abort_reuse: a streamed request's pages are cached before they are filled; they
        # are completed when its answer is (complete_pages), never if it is aborted.
        half = len(pieces) // BLOCK_TOKENS // 2
        pending = self.fault is FaultMode.ABORT_REUSE and request.stream
        self.prefix.insert(pieces, filled_blocks=half if pending else None)
        answer = decision
        if hit.attended != decision.prefilled_text:
            words = tokenizer.tokenize(recall(hit.attended))
            limit = request.max_tokens or len(words)
            answer = dataclasses.replace(decision, pieces=tuple(words[:limit]))
        return dataclasses.replace(answer, cached_tokens=self._reported(hit.tokens))

    def complete_pages(self, request: ChatRequest) -> None:
        """A streamed request's answer was sent whole: its pages hold its tokens now."""
        if self.spec.prefix_cache:
            self.prefix.insert(tokenizer.tokenize(request.prompt_text()))

    def _reported(self, cached: int) -> int | None:
        if self.spec.flavour in _REPORTS_ZERO_CACHED:
            return cached
        if self.spec.flavour is Flavour.VLLM:
            return cached or None
        return None

    def arrive(self, decision: Served) -> InFlight:
        """``decision``'s request joins the running batch."""
        flight = InFlight(decision)
        self.in_flight.append(flight)
        self.stats.peak_in_flight = max(self.stats.peak_in_flight, len(self.in_flight))
        return flight

    def leave(self, flight: InFlight) -> None:
        """The request is done: it leaves the batch."""
        if flight in self.in_flight:
            self.in_flight.remove(flight)

    def batched(self, flight: InFlight) -> Served:
        """What ``flight`` is answered with, given the batch it is decoded in now."""
        if self.fault is not FaultMode.BATCH_MIX:
            return flight.decision
        return mix_batch(
            [f.decision for f in self.in_flight],
            self.in_flight.index(flight),
            at=self.spec.batch_mix_at,
            how=self.spec.batch_mix_how,
        )

    def record(self, decision: Decision, *, tenant: str | None = None) -> None:
        self.stats.requests += 1
        self.stats.prefilled_tokens += decision.prefilled_tokens
        if isinstance(decision, Reject):
            self.stats.rejected += 1
        if isinstance(decision, Answer) and decision.prefilled_text is not None:
            self.pool.write(decision.prefilled_text, decision.prefilled_tokens, tenant=tenant)


def recall(attended: str, *, can_recall: bool = True, miscopy_every: int = 0) -> str:
    """The model: repeat the first kvwatch marker it attended to, verbatim; asked for N codes
    (a prompt with one marker per depth), the first N it attended to, space-separated.

    It learns N from whichever instruction it attended to, the opening one or the closing
    question, so a cut that removes one of them still leaves it the other, as a real model
    would read what is left.
    """
    facts = _FACT_ASKED.findall(attended)
    if facts:
        # A cache canary's question: the code planted for the key asked last (the question
        # ends the prompt), first as planted in what it attended to.
        return _fact(attended, facts[-1]) if can_recall else NOT_FOUND
    found = list(dict.fromkeys(find_markers(attended))) if can_recall else []
    if found and miscopies(attended, miscopy_every):
        found[0] = found[0][:-1]
    asked = _ASKED_FOR.search(attended)
    wanted = int(asked.group(1)) if asked else 1
    answer = " ".join(found[:wanted]) if found else NOT_FOUND
    # A burst canary's word: the model gives back the first one it attended to.
    planted = _WORD_PLANTED.search(attended)
    if planted and can_recall:
        answer = f"{answer} {planted.group(1)}"
    return answer


def miscopies(attended: str, every: int) -> bool:
    """Whether a model that miscopies one prompt in ``every`` miscopies this one: by the
    text's digest, so the same prompt alike every time and in every process."""
    if every <= 0:
        return False
    digest = hashlib.blake2b(attended.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % every == 0


def _fact(attended: str, key: str) -> str:
    at = attended.find(_FACT.format(key=key))
    if at < 0:
        return NOT_FOUND
    codes = find_markers(attended[at : at + 80])
    return f"The {key} code is {codes[0]}." if codes else NOT_FOUND


def mix_batch(batch: Sequence[Served], position: int, *, at: int, how: str) -> Served:
    """What the request at ``position`` of ``batch`` (decisions in arrival order) is answered
    with on an engine whose batches of ``at`` requests or more mix answers: the next
    request's answer (``swap``), or its own answer ending with the next one's number
    (``mix``: a burst's own marker with the next request's word; a swap when either answer
    ends in no word). Only answers mix."""
    own = batch[position]
    if len(batch) < at or not isinstance(own, Answer):
        return own
    rotated = [*batch[position + 1 :], *batch[:position]]
    others = [d for d in rotated if isinstance(d, Answer)]
    if not others:
        return own
    other = others[0]
    text = other.text
    own_word, other_word = _LAST_WORD.search(own.text), _LAST_WORD.search(other.text)
    if how == "mix" and own_word and other_word:
        text = own.text[: own_word.start()] + other_word.group() + own.text[own_word.end() :]
    return dataclasses.replace(own, pieces=tuple(tokenizer.tokenize(text)))


def _over_window(flavour: Flavour, window: int, prompt: int, max_tokens: int | None) -> bool:
    """The engine's own admission rule (DESIGN §1)."""
    if flavour is Flavour.OLLAMA:
        return False  # Ollama never refuses: it truncates (see decide)
    if flavour is Flavour.LLAMACPP or max_tokens is None:
        # llama.cpp rejects prompt >= n_ctx whatever max_tokens says; vLLM does the same when
        # no max_tokens is given (the answer would have no room).
        return prompt >= window
    return prompt + max_tokens > window


def _answer_limit(flavour: Flavour, window: int, prompt: int, max_tokens: int | None) -> int:
    room = window - prompt
    if max_tokens is None:
        limit = room
    elif flavour is Flavour.LLAMACPP:
        # llama.cpp accepts a prompt below n_ctx and stops the answer when the context is full.
        limit = min(max_tokens, room)
    else:
        limit = max_tokens
    return max(1, limit)


def _answer(
    attended: str,
    *,
    limit: int,
    can_recall: bool,
    prompt_tokens: int,
    prefilled_tokens: int,
    prefilled_text: str | None,
    miscopy_every: int = 0,
) -> Answer:
    pieces = tokenizer.tokenize(
        recall(attended, can_recall=can_recall, miscopy_every=miscopy_every)
    )
    finish = "stop"
    if len(pieces) > limit:
        pieces, finish = pieces[:limit], "length"
    return Answer(
        pieces=tuple(pieces),
        finish_reason=finish,
        prompt_tokens=prompt_tokens,
        prefilled_tokens=prefilled_tokens,
        prefilled_text=prefilled_text,
    )


def decide(
    spec: SimEndpoint,
    fault: FaultMode,
    pool: KVPagePool,
    request: ChatRequest,
    vocabulary: tokenizer.Tokenizer = tokenizer.PLAIN,
) -> Decision:
    """What the engine does with ``request``, counting with ``vocabulary``. Reads ``pool``,
    changes nothing."""
    flavour, window = spec.flavour, spec.window
    failed = _fault_reply(flavour, fault)
    if failed is not None:
        return failed
    text = request.prompt_text()
    sent = vocabulary.count(text)
    max_tokens = request.max_tokens
    over_window = _over_window(flavour, window, sent, max_tokens)
    refused = _refusal(spec, fault, sent, max_tokens, over_window=over_window)
    if refused is not None:
        return refused
    if flavour is Flavour.OLLAMA and sent > window and fault is not FaultMode.ACCEPT_OVER_LIMIT:
        return _ollama_cut(text, sent, window, max_tokens, fault, vocabulary)
    read = _Admitted(
        sent=sent,
        limit=_answer_limit(flavour, window, sent, max_tokens),
        can_recall=fault is not FaultMode.NO_RECALL,
        usage_attended=spec.report_usage == "attended",
        miscopy_every=spec.miscopy_every,
    )
    if over_window:  # only ACCEPT_OVER_LIMIT gets here: the context holds the first window.
        kept = text[: vocabulary.char_offset(text, window)]
        return read.answer(kept, window, kept)
    if sent > spec.pool_tokens:
        beyond = _beyond_pool(spec, fault, pool, request, text, read, vocabulary)
        if beyond is not None:
            return beyond
    return read.answer(text, sent, text)


def _fault_reply(flavour: Flavour, fault: FaultMode) -> Reject | None:
    """The reply of a fault that answers every request alike, whatever it asks."""
    if fault is FaultMode.THROTTLED:
        return Reject(
            429,
            errors.rate_limited(RETRY_AFTER_SECONDS),
            headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
        )
    if fault is FaultMode.SERVER_ERROR:
        return Reject(500, errors.error_body(flavour, 500, "Internal server error"))
    return None


def _refusal(
    spec: SimEndpoint, fault: FaultMode, sent: int, max_tokens: int | None, *, over_window: bool
) -> Reject | None:
    """The engine's refusal of a prompt of ``sent`` tokens by its admission rules, if any."""
    flavour, window, pool_tokens = spec.flavour, spec.window, spec.pool_tokens
    if (
        flavour is Flavour.TGI
        and sent > spec.input_limit
        and fault is not FaultMode.ACCEPT_OVER_LIMIT
    ):
        # TGI validates the prompt alone first, then prompt + max_new_tokens.
        return Reject(422, errors.input_length_error(limit=spec.input_limit, prompt_tokens=sent))
    if over_window and fault is not FaultMode.ACCEPT_OVER_LIMIT:
        if fault is FaultMode.WRONG_STATUS:
            return Reject(500, errors.error_body(flavour, 500, "Internal server error"))
        return Reject(
            errors.context_status(flavour),
            errors.context_length_error(
                flavour, window=window, prompt_tokens=sent, max_tokens=max_tokens
            ),
        )
    if fault is FaultMode.WINDOW_NOT_SERVED and _over_window(
        flavour, pool_tokens, sent, max_tokens
    ):
        # The engine enforces the pool it really has, not the window it advertises.
        return Reject(
            400,
            errors.context_length_error(
                flavour, window=pool_tokens, prompt_tokens=sent, max_tokens=max_tokens
            ),
        )
    if flavour is Flavour.SGLANG and fault not in _NO_POOL_GUARD:
        # SGLang's scheduler admits prompts below max_req_input_len only.
        max_req_input_len = min(window, pool_tokens) - 1
        if sent >= max_req_input_len:
            return Reject(400, errors.pool_limit_error(limit=max_req_input_len, prompt_tokens=sent))
    return None


def _ollama_cut(
    text: str,
    sent: int,
    window: int,
    max_tokens: int | None,
    fault: FaultMode,
    vocabulary: tokenizer.Tokenizer,
) -> Answer:
    """Ollama's answer to a prompt longer than its context, which it cuts instead of refusing.

    The runner reads up to num_ctx tokens whole and cuts a longer prompt to num_ctx: the
    first OLLAMA_KEEP tokens and the tail (runner.go NewSequence). The marker is gone. (With
    accept_over_limit it reads the whole prompt instead, as an engine whose context is larger
    than it advertises would; the caller does not cut then.)
    """
    head = text[: vocabulary.char_offset(text, OLLAMA_KEEP)]
    tail = text[vocabulary.char_offset(text, sent - (window - OLLAMA_KEEP)) :]
    kept = head + tail
    return _answer(
        kept,
        limit=max_tokens or 1,
        can_recall=fault is not FaultMode.NO_RECALL,
        prompt_tokens=window,
        prefilled_tokens=window,
        prefilled_text=kept,
    )


@dataclass(frozen=True, slots=True)
class _Admitted:
    """A prompt of ``sent`` tokens the engine admitted: how it answers what it attended to."""

    sent: int
    limit: int  # answer tokens the engine allows
    can_recall: bool
    usage_attended: bool  # the usage reports the tokens attended to, not those sent
    miscopy_every: int = 0  # SimEndpoint.miscopy_every

    def answer(self, attended: str, tokens: int, prefilled_text: str | None) -> Answer:
        """The answer to ``attended``, ``tokens`` of context, left in the pool as
        ``prefilled_text``."""
        return _answer(
            attended,
            limit=self.limit,
            can_recall=self.can_recall,
            miscopy_every=self.miscopy_every,
            prompt_tokens=tokens if self.usage_attended else self.sent,
            prefilled_tokens=tokens,
            prefilled_text=prefilled_text,
        )


def _beyond_pool(
    spec: SimEndpoint,
    fault: FaultMode,
    pool: KVPagePool,
    request: ChatRequest,
    text: str,
    read: _Admitted,
    vocabulary: tokenizer.Tokenizer,
) -> Decision | None:
    """What a faulty engine does with a prompt larger than its KV pool; None: no such fault,
    it reads the prompt whole."""
    sent, pool_tokens = read.sent, spec.pool_tokens
    if fault is FaultMode.STALE_KV:
        # The incident: the prompt is dropped for a placeholder, and decode reads whatever
        # the pages still hold from earlier requests, another tenant's first.
        return read.answer(pool.recent_first(not_of=request.tenant), PLACEHOLDER_TOKENS, None)
    if fault is FaultMode.TRUNCATE_HEAD:
        kept = text[vocabulary.char_offset(text, sent - pool_tokens) :]
        return read.answer(kept, pool_tokens, kept)
    if fault is FaultMode.TRUNCATE_TAIL:
        kept = text[: vocabulary.char_offset(text, pool_tokens)]
        return read.answer(kept, pool_tokens, kept)
    if fault is FaultMode.STREAM_ERROR_FRAME:
        message = (
            f"KV cache exhausted: cannot allocate blocks for {sent} prompt tokens "
            f"(the pool holds {pool_tokens})"
        )
        if request.stream:
            return StreamFailure(errors.stream_error_frame(spec.flavour, message), pool_tokens)
        return Reject(
            500, errors.error_body(spec.flavour, 500, message), prefilled_tokens=pool_tokens
        )
    return None


class Simulation:
    """Every endpoint one simulator process serves, by name. Endpoints share nothing."""

    def __init__(self, endpoints: Sequence[SimEndpoint]) -> None:
        self._states: dict[str, EndpointState] = {}
        # The trace headers each endpoint received (kvwatch.simulator.traces).
        self.traces = ReceivedTraces(kept_per_endpoint(len(endpoints)))
        for spec in endpoints:
            if spec.name in self._states:
                raise ValueError(f"duplicate simulated endpoint name {spec.name!r}")
            self._states[spec.name] = EndpointState(spec)

    def get(self, name: str) -> EndpointState | None:
        return self._states.get(name)

    def __getitem__(self, name: str) -> EndpointState:
        state = self._states.get(name)
        if state is None:
            raise KeyError(f"no simulated endpoint named {name!r}")
        return state

    @property
    def endpoints(self) -> list[SimEndpoint]:
        return [state.spec for state in self._states.values()]

    def set_fault(self, name: str, fault: FaultMode | str) -> None:
        self[name].fault = FaultMode(fault)

    def stats(self) -> dict[str, dict[str, int | str]]:
        return {
            name: {**state.stats.as_dict(), "fault": str(state.fault)}
            for name, state in self._states.items()
        }
