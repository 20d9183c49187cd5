"""The *burst* canary: the same short task sent alone, then N times at once. Pure.

Engines batch concurrent requests, and the batch path has its own bugs: TensorRT-LLM #17964
(at concurrency 8 and more "every request diverged", all HTTP 200) and vLLM #6023 (prefix
caching under concurrency returned other requests' responses). No boundary canary sees
them: each is one request at a time. A burst cycle sends a *solo* request first, then N
requests at once (N cycles through odd sizes, just past the batch sizes engines pad to), each
with its own marker and a word to give back (an animal), drawn per request so that no two
requests of a cycle share one.

Every answer must hold its own marker and its own word. Outputs are never compared
across batch sizes: engines are not batch-invariant by default, so only correctness is.
An answer holding another request's marker is a cross-request leak under load
(``burst_leak``); a wrong answer under load while the solo request was right is
``burst_wrong``; a solo request that fails its own task says the canary cannot work on this
model (``canary_ineffective``), never an incident.
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kvwatch.canary import filler
from kvwatch.canary.model import (
    BurstOutcome,
    BurstRequest,
    Exchange,
    ForeignMarker,
    Judgement,
    Message,
    Verdict,
)
from kvwatch.canary.scan import AnswerScan

# Just past the batch sizes engines pad to or capture graphs for (1, 2, 4, 8, 16, ...): a
# request of an odd-sized batch shares its step with padding, where batch bugs show.
DEFAULT_SIZES: tuple[int, ...] = (3, 7, 9, 17)
DEFAULT_PROMPT_TOKENS = 512
# The fixed text alone is about 60 tokens; less filler than this would not be a prompt.
MIN_PROMPT_TOKENS = 64
# The answer: a marker (7-15 tokens), a number, and the chatter a small model adds.
ANSWER_TOKENS = 48
# Tokens of a request besides its filler: the instruction, the marker, the task and the chat
# template (about 45 in the tokenizers measured), so a request is about ``prompt_tokens``.
FIXED_TOKENS = 48
# The words a request is asked to give back, none of them in the filler's vocabulary: every
# request of a cycle gets its own, so one given a neighbour's answer is always wrong. A word,
# not a sum: Gemma 3 270M got 0 of 24 two-digit sums right in four phrasings and gave back
# 4 of 4 planted words (docs/llamacpp-facts.md, "Burst task").
WORDS: tuple[str, ...] = (
    *("tiger", "zebra", "camel", "eagle", "otter", "whale", "horse", "mouse", "panda"),
    *("koala", "llama", "moose", "shark", "snake", "sheep", "goat", "duck", "frog", "lion"),
    *("wolf", "bear", "deer", "fox", "owl", "rabbit", "monkey", "turtle", "parrot", "donkey"),
    *("beaver", "badger", "falcon", "gecko", "hamster", "lizard", "lobster", "octopus"),
    *("pelican", "penguin", "raccoon"),
)
_WORD = re.compile(r"[a-z]+")
# A marker as a model may spell it (dashes, spaces, case): removed before the word is read, so
# a group of letters inside a marker is never taken for the task's answer.
_MARKER_SPELLING = re.compile(r"KVW(?:[\W_]*[0-9A-Z]){12}", re.IGNORECASE)

# How a verdict and its reason (and, for a cross-tenant leak, its source) become the Judgement.
_Make = Callable[..., Judgement]
_KNOWN = frozenset(WORDS)
# A burst is load on the engine being watched: at most this many requests at once (each gets
# a word of its own).
MAX_SIZE = len(WORDS) - 1


@dataclass(frozen=True, slots=True)
class BurstTask:
    """One request of a burst cycle: its marker and its task."""

    index: int  # 0: the solo request; 1..N: the burst's members
    size: int  # requests sent at once with it (1: the solo request)
    marker: str
    word: str

    @property
    def expected(self) -> str:
        return self.word

    def messages(self, pieces: Sequence[str]) -> tuple[Message, ...]:
        """The prompt: the marker first, the filler, the task at the end."""
        text = (
            f"Remember this code: {self.marker}. Remember this animal: {self.word}. You will "
            "be asked for both at the end.\n\n"
            + "".join(pieces).strip()
            + "\n\nWhat are the code and the animal you were asked to remember? Answer with "
            "the code, then the animal."
        )
        return (Message("user", text),)


def fits(prompt_tokens: int, window: int) -> bool:
    """Whether a burst request of ``prompt_tokens`` leaves its answer room in ``window``."""
    return prompt_tokens + ANSWER_TOKENS <= window


def cycle_prompt_tokens(sizes: Sequence[int], prompt_tokens: int) -> int:
    """The prompt tokens a cycle sends on average over the sizes: the solo request and the
    burst, each about ``prompt_tokens``."""
    return round((1 + sum(sizes) / len(sizes)) * prompt_tokens)


def size_for(sizes: Sequence[int], turn: int) -> int:
    """The burst size of the cycle numbered ``turn``: the sizes in turn."""
    return sizes[turn % len(sizes)]


def draw_tasks(rng: random.Random, markers: Sequence[str], size: int) -> tuple[BurstTask, ...]:
    """The solo task and ``size`` burst tasks, one per marker (``size + 1`` of them), whose
    words all differ."""
    if len(markers) != size + 1:
        raise ValueError(f"a burst of {size} needs {size + 1} markers, got {len(markers)}")
    words = rng.sample(WORDS, size + 1)
    return tuple(
        BurstTask(index, 1 if index == 0 else size, marker, word)
        for index, (marker, word) in enumerate(zip(markers, words, strict=True))
    )


def filler_pieces(rng: random.Random, tokens: int) -> list[str]:
    """About ``tokens`` tokens of filler (a piece is a word, one token in the tokenizers
    measured), different per request: no prefix-cache hit makes a member cheap and blind."""
    pieces: list[str] = []
    stream = filler.sentences(rng)
    while len(pieces) < tokens:
        pieces.extend(next(stream))
    return pieces[:tokens]


def read_word(answer: str | None) -> str | None:
    """The task's answer as given: the last of :data:`WORDS` in the answer, outside any
    marker, in any case."""
    if not answer:
        return None
    given = [w for w in _WORD.findall(_MARKER_SPELLING.sub(" ", answer).lower()) if w in _KNOWN]
    return given[-1] if given else None


@dataclass(frozen=True, slots=True)
class Sent:
    """A request of the cycle with what came back and the markers its answer holds."""

    task: BurstTask
    exchange: Exchange
    scan: AnswerScan


def judge_burst(sent: Sequence[Sent], *, tenant: str | None = None) -> Judgement:
    """The cycle's verdict: a leak first (proof, whatever else happened), then what stops
    the cycle from proving anything (credentials, throttling, a failed solo request), the
    canary itself (the solo task), then the burst's failures and wrong answers."""
    requests = tuple(_request(s, sent) for s in sent)
    foreign = _unique(f for s in sent for f in s.scan.foreign)
    found = all(r.marker_found for r in requests)

    def verdict(v: Verdict, reason: str, crossed: Sequence[ForeignMarker] = ()) -> Judgement:
        return Judgement(
            v, reason, marker_found=found, foreign=foreign, crossed=tuple(crossed), burst=requests
        )

    leak = _leak(sent, requests, tenant, verdict)
    if leak is not None:
        return leak
    stopped = _stopped(sent, requests, verdict)
    if stopped is not None:
        return stopped
    solo, members = requests[0], requests[1:]
    if solo.outcome is BurstOutcome.WRONG:
        return verdict(
            Verdict.CANARY_INEFFECTIVE,
            f"the solo request got its task wrong ({_wrong(solo)}): the model cannot do the "
            "burst task alone, so wrong answers under load would prove nothing",
        )
    wrong = [r for r in members if r.outcome is BurstOutcome.WRONG]
    if wrong:
        first = wrong[0]
        return verdict(
            Verdict.BURST_WRONG,
            f"{len(wrong)} of {len(members)} concurrent requests answered wrong while the "
            f"solo request was right: request {first.index} {_wrong(first)}",
        )
    return verdict(
        Verdict.PASS,
        f"the solo request and {len(members)} concurrent requests each answered their own "
        "marker and task",
    )


def _request(s: Sent, sent: Sequence[Sent]) -> BurstRequest:
    task, ex, scan = s.task, s.exchange, s.scan
    base = BurstRequest(
        index=task.index,
        size=task.size,
        marker=task.marker,
        expected=task.expected,
        outcome=BurstOutcome.FAILED,
        status=ex.status,
        prompt_tokens=ex.prompt_tokens,
        completion_tokens=ex.completion_tokens,
        answer=ex.answer,
    )
    failure = _failure(ex)
    if failure is not None:
        return dataclasses.replace(base, detail=failure[1])
    siblings = tuple(
        o.task.index for o in sent if o.task.index != task.index and scan.recalled(o.task.marker)
    )
    answered = read_word(ex.answer)
    found = scan.recalled(task.marker)
    if scan.foreign:
        outcome = BurstOutcome.FOREIGN
    elif siblings:
        outcome = BurstOutcome.LEAK
    elif found and answered == task.expected:
        outcome = BurstOutcome.RIGHT
    else:
        outcome = BurstOutcome.WRONG
    return dataclasses.replace(
        base,
        outcome=outcome,
        marker_found=found,
        answered=answered,
        siblings=siblings,
        foreign=tuple(f.probe_id for f in scan.foreign),
    )


def _failure(ex: Exchange) -> tuple[Verdict, str] | None:
    """Why a request gave no answer to judge (the verdict it alone would get), or None."""
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
    if ex.streamed and not ex.stream_terminated:
        return Verdict.STREAM_ERROR, "stream ended without its terminator"
    if not ex.body_parsed or ex.answer is None:
        return Verdict.ERROR, f"unusable 2xx body: {ex.error_detail or 'no answer'}"
    return None


def _leak(
    sent: Sequence[Sent], requests: Sequence[BurstRequest], tenant: str | None, verdict: _Make
) -> Judgement | None:
    """Another tenant's marker, another probe's, or another request's of this burst."""
    for s in sent:
        crossed = s.scan.crossed(tenant)
        if crossed:
            first = crossed[0]
            return verdict(
                Verdict.CROSS_TENANT_LEAK,
                f"burst request {s.task.index} sent as tenant {tenant} was answered with the "
                f"marker of probe {first.probe_id} issued under tenant {first.tenant} "
                f"({first.endpoint}, issued {first.issued_at.isoformat()})",
                crossed,
            )
    for s in sent:
        if s.scan.foreign:
            first = s.scan.foreign[0]
            return verdict(
                Verdict.FOREIGN_MARKER,
                f"burst request {s.task.index} was answered with the marker of probe "
                f"{first.probe_id} ({first.endpoint}, issued {first.issued_at.isoformat()})",
            )
    leaked = [r for r in requests if r.outcome is BurstOutcome.LEAK]
    if leaked:
        one = leaked[0]
        whose = ", ".join(str(i) for i in one.siblings)
        return verdict(
            Verdict.BURST_LEAK,
            f"{len(leaked)} of {len(requests)} requests held another request's marker: "
            f"request {one.index} of a burst of {one.size} was answered with the marker "
            f"of request {whose}",
        )
    return None


def _stopped(
    sent: Sequence[Sent], requests: Sequence[BurstRequest], verdict: _Make
) -> Judgement | None:
    """The verdict of a cycle whose failed requests keep it from proving anything."""
    failures = [(r, f) for s, r in zip(sent, requests, strict=True) if (f := _failure(s.exchange))]
    if not failures:
        return None
    kinds = {f[0] for _, f in failures}
    # Credentials, then throttling: each says the same of every request, and neither is
    # about the engine's correctness.
    for v in (Verdict.AUTH_ERROR, Verdict.THROTTLED):
        if v in kinds:
            first = next((r, f) for r, f in failures if f[0] is v)
            return verdict(v, f"request {first[0].index}: {first[1][1]}")
    request, (v, detail) = failures[0]
    if request.index == 0:
        return verdict(v, f"the solo request failed: {detail}")
    return verdict(
        v,
        f"{len(failures)} of {len(requests) - 1} concurrent requests failed: request "
        f"{request.index}: {detail}",
    )


def _wrong(request: BurstRequest) -> str:
    if not request.marker_found:
        return "did not give back its marker"
    given = "no animal" if request.answered is None else f'"{request.answered}"'
    return f'answered {given} where its animal is "{request.expected}"'


def _unique(markers: Iterable[ForeignMarker]) -> list[ForeignMarker]:
    seen: dict[str, ForeignMarker] = {}
    for m in markers:
        seen.setdefault(m.marker, m)
    return list(seen.values())
