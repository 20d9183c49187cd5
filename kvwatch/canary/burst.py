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
(``burst_leak``); a solo request that fails its own task says the canary cannot work on this
model (``canary_ineffective``), never an incident.

A member that answered wrong is sent again alone, the same prompt (its *control*). The solo
request proves the model does the task on *its* prompt, not on every prompt: a small model
fails some prompts whatever the batch, the same way every time (Gemma 3 270M dropped part of
a marker on 2 of 240 requests, and again each time the prompt was sent alone;
docs/llamacpp-facts.md, "Burst task under batching"). So a member wrong in the burst and
right alone is ``burst_wrong``; one wrong alone too is the model's failure, not the batch's
(``canary_ineffective``). The control is the very prompt, not a variant behind a new first
line (as the cache canary's): a small model's answer turns on single tokens (a leading line
fixed one of those two prompts), so only the same tokens tell the batch from the model. An
engine may serve the control from its prefix cache, built by the batch; if the batch broke
those pages the control is wrong too, so more wrong members than :data:`MAX_CONTROLS` are
``burst_wrong`` without controls: a model that fails a prompt now and then does not fail
four of one burst.
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
# Wrong members a cycle sends again alone, at most: more wrong members than this is a batch
# fault without controls (the model failed 2 of 240 prompts, never two in one cycle).
MAX_CONTROLS = 3


@dataclass(frozen=True, slots=True)
class BurstTask:
    """One request of a burst cycle: its marker and its task."""

    index: int  # 0: the solo request; 1..N: the burst's members
    size: int  # requests sent at once with it (1: the solo request or a control)
    marker: str
    word: str
    control: bool = False  # member ``index`` sent again alone (see :func:`control_of`)

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


def control_of(task: BurstTask) -> BurstTask:
    """The control of member ``task``: its own prompt, sent alone."""
    return dataclasses.replace(task, size=1, control=True)


def needs_controls(requests: Sequence[BurstRequest]) -> tuple[int, ...]:
    """The members to send again alone: those that answered wrong after a right solo request,
    with nothing else wrong (a leak or a failure is judged as it stands), when they are no
    more than :data:`MAX_CONTROLS` (more is a batch fault as it stands)."""
    if not requests or requests[0].outcome is not BurstOutcome.RIGHT:
        return ()
    if any(r.outcome not in (BurstOutcome.RIGHT, BurstOutcome.WRONG) for r in requests):
        return ()
    wrong = tuple(r.index for r in _members(requests) if r.outcome is BurstOutcome.WRONG)
    return wrong if len(wrong) <= MAX_CONTROLS else ()


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
    solo, members = requests[0], _members(requests)
    if solo.outcome is BurstOutcome.WRONG:
        return verdict(
            Verdict.CANARY_INEFFECTIVE,
            f"the solo request got its task wrong ({_wrong(solo)}): the model cannot do the "
            "burst task alone, so wrong answers under load would prove nothing",
        )
    wrong = [r for r in members if r.outcome is BurstOutcome.WRONG]
    if wrong:
        return _judge_wrong(wrong, len(members), requests, verdict)
    return verdict(
        Verdict.PASS,
        f"the solo request and {len(members)} concurrent requests each answered their own "
        "marker and task",
    )


def _judge_wrong(
    wrong: Sequence[BurstRequest], size: int, requests: Sequence[BurstRequest], verdict: _Make
) -> Judgement:
    """Members that answered wrong after a right solo request: ``burst_wrong`` when more than
    :data:`MAX_CONTROLS`, or when one answered right sent again alone; the model's failure
    when each answered wrong alone too (or was never sent alone)."""
    said = (
        f"{len(wrong)} of {size} concurrent requests answered wrong while the solo request "
        "was right"
    )
    first = wrong[0]
    if len(wrong) > MAX_CONTROLS:
        return verdict(
            Verdict.BURST_WRONG,
            f"{said}: request {first.index} {_wrong(first)} (more at once than a model that "
            "fails a prompt now and then)",
        )
    controls = {r.index: r for r in requests if r.control}
    for r in wrong:
        control = controls.get(r.index)
        if control is not None and control.outcome is BurstOutcome.RIGHT:
            return verdict(
                Verdict.BURST_WRONG,
                f"{said}: request {r.index} {_wrong(r)}, and answered right when sent again alone",
            )
    control = controls.get(first.index)
    if control is None:
        return verdict(
            Verdict.CANARY_INEFFECTIVE,
            f"{said}: request {first.index} {_wrong(first)}, and was not sent again alone to "
            "tell the batch from the model",
        )
    again = "it" if len(wrong) == 1 else f"each of the {len(wrong)}"
    return verdict(
        Verdict.CANARY_INEFFECTIVE,
        f"{said}, but {again} sent again alone answered wrong too (request {first.index} "
        f"{_wrong(control)}): the model cannot do the task on those prompts, whatever the "
        "batch",
    )


def _members(requests: Sequence[BurstRequest]) -> list[BurstRequest]:
    """The burst's members: every request but the solo one and the controls."""
    return [r for r in requests[1:] if not r.control]


def _request(s: Sent, sent: Sequence[Sent]) -> BurstRequest:
    task, ex, scan = s.task, s.exchange, s.scan
    base = BurstRequest(
        index=task.index,
        size=task.size,
        control=task.control,
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
    # A control shares its member's index and marker: one entry per request held.
    siblings = tuple(
        dict.fromkeys(
            o.task.index
            for o in sent
            if o.task.index != task.index and scan.recalled(o.task.marker)
        )
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
        which = (
            f"request {one.index} sent again alone"
            if one.control
            else f"request {one.index} of a burst of {one.size}"
        )
        return verdict(
            Verdict.BURST_LEAK,
            f"{len(leaked)} of {len(requests)} requests held another request's marker: "
            f"{which} was answered with the marker of request {whose}",
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
    if request.control:
        return verdict(v, f"request {request.index} sent again alone failed: {detail}")
    return verdict(
        v,
        f"{len(failures)} of {len(_members(requests))} concurrent requests failed: request "
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
