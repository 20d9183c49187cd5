"""The *cache* canary: a document of planted facts asked about cold, then from the engine's
prefix cache. Pure.

Boundary canaries force a fresh prefill on purpose, so none of them takes the path where most
public KV-corruption bugs live, a cache hit: vLLM #6023 (prefix caching under concurrency
returned other requests' responses), SGLang PR #28374 (the KV of aborted requests entered
the radix cache and was reused), LMCache #4385 (offloaded sessions got other requests' KV),
all answering HTTP 200. A cache cycle plants a document with facts (a key and its code, each
code a kvwatch marker, unique to the cycle) and asks about it:

- ``cold``: document A, one fact (a miss: the document is new);
- ``warm``: A again with a *different* question (the engine should serve A from its cache);
- ``branch``: A', which shares A's first part and then holds other codes for the same keys
  (a correct cache reuses only the shared part; one that serves A's later pages answers with
  A's code);
- ``abort`` then ``reuse``: a fresh document B streamed and disconnected after the first
  chunk, then asked about at once (an aborted request's pages must not be served wrong);
- ``return`` (optional): a document planted a configured time earlier, asked again (after
  offload and restore);
- ``control``: when a cached step answered wrong, its question again behind a distinct first
  line, so no cache hit is possible; twice, each behind its own line (see :data:`CONTROLS`).

A wrong cached answer while the cold step and both controls were right is ``cache_corrupt``; a
control that is wrong too says the model cannot answer that question (``canary_ineffective``).
A warm step that shows no cache hit did not test the hit path (``cache_not_exercised``).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from kvwatch.canary import filler
from kvwatch.canary.markers import canonical
from kvwatch.canary.model import (
    CacheOutcome,
    CacheStep,
    Exchange,
    ForeignMarker,
    Judgement,
    Message,
    Verdict,
)
from kvwatch.canary.scan import AnswerScan

DEFAULT_DOCUMENT_TOKENS = 3000
# Below this the document is mostly its fixed text: too little to be worth a cache.
MIN_DOCUMENT_TOKENS = 256
# The answer: a code (7-15 tokens) and the chatter a small model adds.
ANSWER_TOKENS = 40
# Tokens of a request besides its filler: the instruction, four fact lines, the question and
# the chat template (about 120 in the tokenizers measured).
FIXED_TOKENS = 120
# Where the four facts sit in the filler: two in the first part A' shares with A, two after.
FACT_DEPTHS: tuple[float, ...] = (0.15, 0.4, 0.6, 0.85)
# Where A' departs from A: just before its third fact.
BRANCH_AT = 2
KEYS: tuple[str, ...] = (
    *("amber", "cobalt", "crimson", "ivory", "jade", "olive", "scarlet", "violet"),
    *("copper", "silver", "indigo", "coral", "maroon", "teal", "ochre", "cyan"),
)
# Controls a wrong cached step needs, all right, before the cache is blamed. A cached prefill
# is computed in other batches than a fresh one, so its numbers differ in the last bits, and a
# small model on the edge of its recall can answer a question right fresh and wrong from the
# cache on a healthy engine: llama-server with Gemma 3 270M did so in CI (cold and one control
# right, warm wrong with 257 tokens cached). Each control's own first line perturbs it again,
# so two right controls show the answer does not hang on such noise. The second is sent only
# when the first was right.
CONTROLS = 2
# The steps a cycle sends, in order, and those an engine should serve from its cache.
STEPS: tuple[str, ...] = ("cold", "warm", "branch", "abort", "reuse")
CACHED_STEPS = frozenset({"warm", "branch", "reuse", "return"})

# Planted documents kept per endpoint for the returning session: bounded, so an interval far
# shorter than return_after cannot grow the daemon's memory.
KEPT_DOCUMENTS = 16

_Make = Callable[..., Judgement]


@dataclass(frozen=True, slots=True)
class Document:
    """A planted document: its label, first line, facts (key -> code) and filler."""

    label: str
    nonce: str  # its first line's random word: different per document, so no stale hit
    facts: tuple[tuple[str, str], ...]  # (key, code) in the order planted
    pieces: tuple[str, ...]  # the filler, about one token a piece

    def code(self, key: str) -> str:
        return dict(self.facts)[key]

    def text(self, *, control: str | None = None) -> str:
        """The document; with ``control``, behind a distinct first line (no cache hit)."""
        head = f"Control {control}.\n" if control else ""
        cuts = [round(d * len(self.pieces)) for d in FACT_DEPTHS]
        parts, start = [], 0
        for cut, (key, code) in zip(cuts, self.facts, strict=True):
            parts.append("".join(self.pieces[start:cut]).strip())
            parts.append(f"The {key} code is {code}.")
            start = cut
        parts.append("".join(self.pieces[start:]).strip())
        return (
            f"{head}Document {self.nonce}. It lists codes by colour; you will be asked for "
            "one of them.\n\n" + "\n".join(p for p in parts if p)
        )


@dataclass(frozen=True, slots=True)
class Ask:
    """One step's request: which document, which fact."""

    step: str
    document: Document
    key: str
    control: str | None = None  # the control step's first line

    @property
    def expected(self) -> str:
        return self.document.code(self.key)

    def messages(self) -> tuple[Message, ...]:
        """The document first (the prefix a cache holds), the question at the very end."""
        text = (
            self.document.text(control=self.control)
            + f"\n\nWhat is the {self.key} code? Answer with the code only."
        )
        return (Message("user", text),)


@dataclass(frozen=True, slots=True)
class CycleTokens:
    """What one cache cycle sends, by kvwatch's plan (the engine's counts are stored)."""

    requests: int
    prompt: int  # every step's prompt
    cached: int  # of which an engine with prefix caching should serve from its cache
    completion: int  # answer tokens at most


def cycle_tokens(document_tokens: int, *, returning: bool) -> CycleTokens:
    """A cycle's tokens with no control step (sent only after a wrong answer): five steps
    about documents of ``document_tokens`` (and a returning one). Warm and reuse can be
    served whole from the cache, the branch up to where A' parts from A, a returning document
    whole if the cache still holds it; cold and abort are fresh. The abort step's answer is
    cut after its first chunk."""
    steps = len(STEPS) + (1 if returning else 0)
    shared = FACT_DEPTHS[BRANCH_AT]
    cached = document_tokens * (2 + shared + (1 if returning else 0))
    return CycleTokens(
        requests=steps,
        prompt=steps * document_tokens,
        cached=round(cached),
        completion=(steps - 1) * ANSWER_TOKENS + 1,
    )


def fits(document_tokens: int, window: int) -> bool:
    """Whether a request about a document of ``document_tokens`` leaves its answer room."""
    return document_tokens + ANSWER_TOKENS <= window


def draw_document(rng: random.Random, label: str, codes: Sequence[str], tokens: int) -> Document:
    """A document of about ``tokens`` tokens with one fact per code (four codes)."""
    if len(codes) != len(FACT_DEPTHS):
        raise ValueError(f"a document holds {len(FACT_DEPTHS)} facts, got {len(codes)} codes")
    keys = rng.sample(KEYS, len(codes))
    return Document(
        label=label,
        nonce=f"{rng.getrandbits(40):010x}",
        facts=tuple(zip(keys, codes, strict=True)),
        pieces=tuple(filler_pieces(rng, max(0, tokens - FIXED_TOKENS))),
    )


def branch_of(a: Document, codes: Sequence[str]) -> Document:
    """A': A's first part unchanged (its nonce, filler and first facts), then the same keys
    with new ``codes``: a correct cache reuses A only up to where they part."""
    if len(codes) != len(a.facts) - BRANCH_AT:
        raise ValueError(f"A' needs {len(a.facts) - BRANCH_AT} new codes, got {len(codes)}")
    facts = a.facts[:BRANCH_AT] + tuple(
        (key, code) for (key, _), code in zip(a.facts[BRANCH_AT:], codes, strict=True)
    )
    return dataclasses.replace(a, label=f"{a.label}'", facts=facts)


def plan_cycle(a: Document, a2: Document, b: Document) -> tuple[Ask, ...]:
    """The steps of a cycle: cold and warm on A (different facts after A' parts from it),
    the branch on A', the abort and the reuse on B (an early fact, then a late one)."""
    k = [key for key, _ in a.facts]
    kb = [key for key, _ in b.facts]
    return (
        Ask("cold", a, k[2]),
        Ask("warm", a, k[3]),
        Ask("branch", a2, k[2]),
        Ask("abort", b, kb[0]),
        Ask("reuse", b, kb[3]),
    )


def returning(old: Document) -> Ask:
    """The returning step: an earlier cycle's document, asked for a fact it was not asked."""
    return Ask("return", old, old.facts[1][0])


def control_of(ask: Ask, nonce: str) -> Ask:
    """The control for ``ask``: the same document and question behind a new first line."""
    return Ask("control", ask.document, ask.key, control=nonce)


def filler_pieces(rng: random.Random, tokens: int) -> list[str]:
    """About ``tokens`` tokens of filler (a piece is a word, one token in the tokenizers
    measured), different per document."""
    pieces: list[str] = []
    stream = filler.sentences(rng)
    while len(pieces) < tokens:
        pieces.extend(next(stream))
    return pieces[:tokens]


def planted(documents: Iterable[Document]) -> dict[str, str]:
    """Every code of ``documents`` with where it was planted ("A amber")."""
    return {code: f"{d.label} {key}" for d in documents for key, code in d.facts}


@dataclass(frozen=True, slots=True)
class Sent:
    """A step of the cycle with what came back and the markers its answer holds."""

    ask: Ask
    exchange: Exchange
    scan: AnswerScan


def step_of(s: Sent, codes: Mapping[str, str]) -> CacheStep:
    """One step judged alone: its outcome and evidence."""
    ask, ex, scan = s.ask, s.exchange, s.scan
    base = CacheStep(
        step=ask.step,
        document=ask.document.label,
        key=ask.key,
        expected=ask.expected,
        outcome=CacheOutcome.FAILED,
        status=ex.status,
        cached_tokens=ex.cached_prompt_tokens,
        prompt_tokens=ex.prompt_tokens,
        completion_tokens=ex.completion_tokens,
        answer=ex.answer,
    )
    failure = failure_of(ex, aborted=ask.step == "abort")
    if failure is not None:
        return dataclasses.replace(base, detail=failure[1])
    found = scan.recalled(ask.expected)
    given = first_code(scan, codes)
    # The answer is the first code of the cycle it gives: a small model goes on listing the
    # document's other facts after answering (Gemma 3 270M does), which is chatter, not a
    # wrong answer. A cache serving wrong pages changes the first code.
    others = () if given is None or given == canonical(ask.expected) else (codes_at(codes)[given],)
    if scan.foreign:
        outcome = CacheOutcome.FOREIGN
    elif ask.step == "abort":
        outcome = CacheOutcome.ABORTED
    elif given == canonical(ask.expected):
        outcome = CacheOutcome.RIGHT
    else:
        outcome = CacheOutcome.WRONG
    return dataclasses.replace(
        base,
        outcome=outcome,
        code_found=found,
        answered=others,
        foreign=tuple(f.probe_id for f in scan.foreign),
    )


def codes_at(codes: Mapping[str, str]) -> dict[str, str]:
    """The cycle's codes by their canonical spelling, with where each was planted."""
    return {canonical(code): where for code, where in codes.items()}


def first_code(scan: AnswerScan, codes: Mapping[str, str]) -> str | None:
    """The first code of the cycle the answer gives (canonical), or None."""
    known = codes_at(codes)
    return next((code for code in scan.seen if code in known), None)


def warm_hit(step: CacheStep) -> bool:
    """Whether the engine served the warm step from its cache: at least half its prompt (it
    shares all but its question with the cold step). A few tokens cached, as llama.cpp reports
    for an SWA model (Gemma 3) without --swa-full, are the chat template's, not the
    document's."""
    if not step.cached_tokens:
        return False
    return step.prompt_tokens is None or 2 * step.cached_tokens >= step.prompt_tokens


def failure_of(ex: Exchange, *, aborted: bool = False) -> tuple[Verdict, str] | None:
    """Why a step gave no answer to judge (the verdict it alone would get), or None. The
    abort step's stream ends early by design: only its status counts."""
    if ex.transport_error is not None:
        return Verdict.ERROR, f"transport failure ({ex.transport_error}): {ex.error_detail}"
    status = ex.status
    if status is None:
        return Verdict.ERROR, "no HTTP status recorded"
    if status in (401, 403):
        return Verdict.AUTH_ERROR, f"HTTP {status}: credentials refused"
    if status == 429:
        return Verdict.THROTTLED, "HTTP 429: throttled, retry later"
    if not 200 <= status < 300:
        return Verdict.ERROR, f"HTTP {status}: {ex.error_detail or 'no detail'}"
    if ex.stream_error_frame:
        return Verdict.STREAM_ERROR, "200 stream carried an error frame"
    if aborted:
        return None
    if ex.streamed and not ex.stream_terminated:
        return Verdict.STREAM_ERROR, "stream ended without its terminator"
    if not ex.body_parsed or ex.answer is None:
        return Verdict.ERROR, f"unusable 2xx body: {ex.error_detail or 'no answer'}"
    return None


def needs_control(steps: Sequence[CacheStep]) -> int | None:
    """The index of the cached step to re-ask with no cache hit possible: the first one that
    answered wrong after a right cold step, with nothing else wrong (a leak or a failure is
    judged as it stands), while fewer than :data:`CONTROLS` controls were sent and every one
    sent was right; None when no (further) control is needed."""
    if not steps or steps[0].outcome is not CacheOutcome.RIGHT:
        return None
    controls = [s.outcome for s in steps if s.step == "control"]
    if len(controls) >= CONTROLS or any(o is not CacheOutcome.RIGHT for o in controls):
        return None  # enough controls, or a wrong one already says the model cannot answer
    if any(s.outcome in (CacheOutcome.FOREIGN, CacheOutcome.FAILED) for s in steps):
        return None
    return next(
        (
            i
            for i, s in enumerate(steps)
            if s.step in CACHED_STEPS and s.outcome is CacheOutcome.WRONG
        ),
        None,
    )


def judge_cache(
    sent: Sequence[Sent], codes: Mapping[str, str], *, tenant: str | None = None
) -> Judgement:
    """The cycle's verdict: a leak first (proof, whatever else happened), then what stops the
    cycle from proving anything, the canary itself (the cold step), a wrong cached step (with
    its control), and last whether the warm step was served from the cache at all."""
    steps = tuple(step_of(s, codes) for s in sent)
    foreign = _unique(f for s in sent for f in s.scan.foreign)
    found = all(s.code_found for s in steps if s.step != "abort")

    def verdict(v: Verdict, reason: str, crossed: Sequence[ForeignMarker] = ()) -> Judgement:
        return Judgement(
            v, reason, marker_found=found, foreign=foreign, crossed=tuple(crossed), cache=steps
        )

    early = _leak(sent, tenant, verdict) or _stopped(sent, verdict)
    if early is not None:
        return early
    cold = steps[0]
    if cold.outcome is not CacheOutcome.RIGHT:
        return verdict(
            Verdict.CANARY_INEFFECTIVE,
            f"the cold step {_wrong(cold)}: the model cannot recall the planted facts without "
            "any cache, so wrong answers from the cache would prove nothing",
        )
    wrong = _wrong_cached(steps, verdict)
    if wrong is not None:
        return wrong
    warm = next(s for s in steps if s.step == "warm")
    if not warm_hit(warm):
        said = (
            "reported no cached tokens"
            if warm.cached_tokens is None
            else f"had {warm.cached_tokens} of its {warm.prompt_tokens} prompt tokens served "
            "from it"
        )
        return verdict(
            Verdict.CACHE_NOT_EXERCISED,
            f"every answer was right, but the warm step {said}: the prefix-cache path was not "
            "tested (enable prefix caching and its usage report; see kvwatch check-config)",
        )
    hits = ", ".join(f"{s.step} {s.cached_tokens}" for s in steps if s.cached_tokens)
    return verdict(
        Verdict.PASS,
        f"{len(steps)} steps answered their own facts; cached prompt tokens: {hits}",
    )


def _wrong_cached(steps: Sequence[CacheStep], verdict: _Make) -> Judgement | None:
    """A cached step that answered wrong, judged by its controls (the last steps, if sent)."""
    wrong = [s for s in steps if s.step in CACHED_STEPS and s.outcome is CacheOutcome.WRONG]
    if not wrong:
        return None
    first = wrong[0]
    controls = [s for s in steps if s.step == "control"]
    if not controls:
        return verdict(
            Verdict.CANARY_INEFFECTIVE,
            f"the {first.step} step {_wrong(first)}, and no control was sent to tell a cache "
            "fault from the model",
        )
    failed = next((c for c in controls if c.outcome is not CacheOutcome.RIGHT), None)
    if failed is not None:
        return verdict(
            Verdict.CANARY_INEFFECTIVE,
            f"the {first.step} step {_wrong(first)}, and so did its control with no cache "
            f"hit ({_wrong(failed)}): the model cannot answer this question",
        )
    if len(controls) < CONTROLS:
        return verdict(
            Verdict.CANARY_INEFFECTIVE,
            f"the {first.step} step {_wrong(first)}; {len(controls)} of the {CONTROLS} "
            "controls it needs were sent, too few to tell a cache fault from the model",
        )
    if first.cached_tokens == 0:
        return verdict(
            Verdict.CANARY_INEFFECTIVE,
            f"the {first.step} step {_wrong(first)} with 0 tokens served from the cache, "
            "while its control was right: the model's recall is unsteady, not the cache",
        )
    served = "an unreported number of" if first.cached_tokens is None else first.cached_tokens
    return verdict(
        Verdict.CACHE_CORRUPT,
        f"the {first.step} step, with {served} prompt tokens served from the cache, "
        f"{_wrong(first)}, while the cold step and {len(controls)} controls with no cache "
        "hit were right",
    )


def _leak(sent: Sequence[Sent], tenant: str | None, verdict: _Make) -> Judgement | None:
    """Another tenant's marker, or another probe's, in any step's answer."""
    for s in sent:
        crossed = s.scan.crossed(tenant)
        if crossed:
            first = crossed[0]
            return verdict(
                Verdict.CROSS_TENANT_LEAK,
                f"the {s.ask.step} step sent as tenant {tenant} was answered with the marker "
                f"of probe {first.probe_id} issued under tenant {first.tenant} "
                f"({first.endpoint}, issued {first.issued_at.isoformat()})",
                crossed,
            )
    for s in sent:
        if s.scan.foreign:
            first = s.scan.foreign[0]
            return verdict(
                Verdict.FOREIGN_MARKER,
                f"the {s.ask.step} step was answered with the marker of probe "
                f"{first.probe_id} ({first.endpoint}, issued {first.issued_at.isoformat()})",
            )
    return None


def _stopped(sent: Sequence[Sent], verdict: _Make) -> Judgement | None:
    """The verdict of a cycle whose failed steps keep it from proving anything."""
    failures = [
        (s.ask.step, f)
        for s in sent
        if (f := failure_of(s.exchange, aborted=s.ask.step == "abort")) is not None
    ]
    if not failures:
        return None
    # Credentials, then throttling: each says the same of every step, and neither is about
    # the engine's correctness.
    for v in (Verdict.AUTH_ERROR, Verdict.THROTTLED):
        hit = next(((step, f) for step, f in failures if f[0] is v), None)
        if hit is not None:
            return verdict(v, f"the {hit[0]} step: {hit[1][1]}")
    step, (v, detail) = failures[0]
    return verdict(v, f"the {step} step failed: {detail}")


def _wrong(step: CacheStep) -> str:
    if step.answered:
        return (
            f"answered the {step.key} code of document {step.document} with the code planted "
            f"as {', '.join(step.answered)}"
        )
    return f"did not give the {step.key} code of document {step.document}"


def _unique(found: Iterable[ForeignMarker]) -> list[ForeignMarker]:
    seen: dict[str, ForeignMarker] = {}
    for m in found:
        seen.setdefault(m.marker, m)
    return list(seen.values())
