"""Prompt planning: build a canary prompt of an exact token count (DESIGN §3).

The planner never tokenizes the whole prompt many times. It counts the fixed parts once
(instruction, marker, question, chat template), counts each distinct filler piece once (the
counter caches them per endpoint), assembles filler whose known counts add up to the target,
verifies the total with one full-prompt count, and corrects by the difference. Real
tokenizers are almost additive over space-separated words, so the first verification is
usually exact and a second one settles the rest.

A prompt may carry one marker per configured depth (issue 12: the answer then shows which
part of the prompt the engine read). Only the fixed text changes; the filler, its one
count per piece and the single verification are the same, so several markers cost no
extra tokenize call.

This module does no I/O of its own: it is handed a :class:`TokenCounter`.
"""

from __future__ import annotations

import enum
import functools
import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from kvwatch.canary import filler
from kvwatch.canary.collapse import swallowed_reason, template_swallows_content
from kvwatch.canary.counting import TokenCounter
from kvwatch.canary.markers import PREFIX as MARKER_PREFIX
from kvwatch.canary.model import Message, Placement, PlannedPrompt, ProbeKind

QUESTION = "What is the code you were asked to remember? Answer with the code only."
# Answer tokens to allow per code when a prompt carries one per depth: a marker is 7-15
# tokens in the tokenizers measured (the simulator's is the longest), plus a separator.
ANSWER_TOKENS_PER_CODE = 16
# Depths closer than 1/1000 of the filler apart share a stretch anyway (config takes any
# fraction); counting the fixed text around more pieces than this buys nothing.
MAX_SEED_PIECES = 2000
# Tokens a serving stack's chat template may add around the prompt's text (role headers,
# special tokens, a default system prompt). Gemma 3's adds 9 on llama-server; a template
# with a long default system prompt can add more, and then a prompt just above
# smallest_canary() may still be refused (the served-window search survives that).
TEMPLATE_ALLOWANCE = 256


class Side(enum.Enum):
    """Which way a prompt may miss its target when an exact hit is impossible."""

    AT_MOST = "at_most"  # under/baseline: one token too many could cross the window
    AT_LEAST = "at_least"  # over: one token too few could be legitimately accepted


class PlanningError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Layout:
    """The fixed text around the filler for a marker planted at ``depth`` of the filler."""

    marker: str
    depth: float

    def head(self) -> str:
        if self.depth <= 0:
            return f"Remember this code: {self.marker}. You will be asked for it at the end.\n\n"
        return "Remember the code that appears in the text below. You will be asked for it.\n\n"

    def middle(self) -> str:
        return "" if self.depth <= 0 else f"\n\nThe code is {self.marker}. Remember it.\n\n"

    def tail(self) -> str:
        return f"\n\n{QUESTION}"

    def messages(self, pieces: Sequence[str]) -> tuple[Message, ...]:
        split = round(len(pieces) * self.depth) if self.depth > 0 else 0
        text = (
            self.head()
            + "".join(pieces[:split])
            + self.middle()
            + "".join(pieces[split:]).lstrip()
            + self.tail()
        )
        return (Message("user", text),)


@dataclass(frozen=True, slots=True)
class MultiLayout:
    """The fixed text around the filler for one marker at each of several depths.

    Codes are numbered in prompt order and asked for in that order, which is the easiest
    way for a model to give them back; a marker at depth 0 opens the prompt as the single
    marker does, and one at depth 1 sits just before the question.
    """

    placements: tuple[Placement, ...]  # shallowest first, at least two

    def messages(self, pieces: Sequence[str]) -> tuple[Message, ...]:
        n = len(self.placements)
        parts = [f"Remember the {n} codes in this text. You will be asked for all of them.\n\n"]
        start = 0
        for number, placement in enumerate(self.placements, start=1):
            split = max(start, round(len(pieces) * placement.depth))
            segment = "".join(pieces[start:split]).strip()
            if segment:
                parts.append(f"{segment}\n\n")
            parts.append(f"Code {number} is {placement.marker}.\n\n")
            start = split
        parts.append("".join(pieces[start:]).strip())
        return (Message("user", "".join(parts).rstrip() + f"\n\n{multi_question(n)}"),)

    def seed_pieces(self) -> int:
        """How many filler pieces give every stretch between two markers at least one, as
        the real filler will: the fixed text is counted around that many, so that it is
        counted with the same separators as the real prompt."""
        depths = [p.depth for p in self.placements]
        # The stretches before the first and after the last marker count too, unless the
        # marker sits at the very start or end (that stretch is then empty in both).
        edges = [0.0] * (depths[0] > 0) + depths + [1.0] * (depths[-1] < 1)
        gap = min(b - a for a, b in itertools.pairwise(edges))
        return min(MAX_SEED_PIECES, max(1, math.ceil(2 / gap)))


def multi_question(n: int) -> str:
    return (
        f"What are the {n} codes you were asked to remember? "
        "Answer with the codes only, in order, separated by spaces."
    )


def smallest_canary(markers: int = 1) -> int:
    """A prompt size a canary carrying ``markers`` markers can be planned at, on any tokenizer.

    :func:`plan_prompt` refuses a target smaller than the canary's fixed text (instruction,
    markers, question, as the target's template wraps them): no canary exists below it, so
    no probe can show that such a size is served. That count depends on the tokenizer and
    the marker drawn; this bound depends on neither: a tokenizer spends at most one token
    per byte of text (byte-level BPE, byte-fallback SentencePiece; English runs at about one
    per four bytes), plus :data:`TEMPLATE_ALLOWANCE` for the template. Pure.
    """
    sample = f"{MARKER_PREFIX}-0000-0000-0000"  # every marker has this length
    if markers <= 1:
        # A marker below the start moves it from the opening sentence to its own: longer.
        texts = [_fixed_text(Layout(sample, depth)) for depth in (0.0, 0.5)]
    else:
        depths = [i / (markers - 1) for i in range(markers)]
        texts = [_fixed_text(MultiLayout(tuple(Placement(d, sample) for d in depths)))]
    return max(len(text.encode()) for text in texts) + TEMPLATE_ALLOWANCE


def _fixed_text(layout: Layout | MultiLayout) -> str:
    return "".join(m.content for m in layout.messages(()))


@dataclass(frozen=True, slots=True)
class Costs:
    """What filler costs on one tokenizer: every vocabulary piece and pool sentence."""

    of: dict[str, int]  # piece or pool sentence -> tokens
    singles: tuple[str, ...]  # the pieces that correct a prompt token by token
    sentences: tuple[str, ...]  # the pool's sentences as text
    sentence_costs: tuple[int, ...]
    mean_sentence: int


@functools.lru_cache(maxsize=64)  # one per distinct tokenizer; 64 bounds a fleet of many
def piece_costs(vocabulary_counts: tuple[int, ...]) -> Costs:
    """Costs from the token count of each :func:`filler.vocabulary` piece, in its order.

    Cached by those counts, so endpoints whose tokenizers agree share one table and a
    plan pays nothing for it after the first.
    """
    counts = dict(zip(filler.vocabulary(), vocabulary_counts, strict=True))
    singles = [p for p, n in counts.items() if n == 1 and p != filler.FULL_STOP]
    if not singles:
        # Every piece costs more than a token: correct with the cheapest ones, less precisely.
        cheapest = min(counts.values())
        singles = [p for p, n in counts.items() if n == cheapest]
    pool = filler.sentence_pool()
    texts = tuple("".join(sentence) for sentence in pool)
    sentence_costs = tuple(sum(counts[p] for p in sentence) for sentence in pool)
    return Costs(
        of={**counts, **dict(zip(texts, sentence_costs, strict=True))},
        singles=tuple(singles),
        sentences=texts,
        sentence_costs=sentence_costs,
        mean_sentence=max(1, sum(sentence_costs) // len(sentence_costs)),
    )


def side_for(kind: ProbeKind) -> Side:
    # over and edge must be at least their size: one token short could be legitimately served.
    return Side.AT_LEAST if kind in (ProbeKind.OVER, ProbeKind.EDGE) else Side.AT_MOST


async def plan_prompt(
    kind: ProbeKind,
    *,
    counter: TokenCounter,
    target_tokens: int,
    marker: str,
    max_tokens: int,
    rng: random.Random,
    depth: float = 0.0,
    placements: Sequence[Placement] = (),
    max_rounds: int = 6,
    window: int | None = None,
) -> PlannedPrompt:
    """Plan a prompt of ``target_tokens`` prompt tokens as the target counts them.

    With two or more ``placements`` the prompt carries each of their markers at its depth,
    and ``marker``/``depth`` must be the shallowest of them. ``window`` is the window the
    size was derived from, kept with the plan for judging the engine's count.
    """
    ordered, layout = _layout(marker, depth, placements)
    costs = piece_costs(tuple(await counter.count_pieces(filler.vocabulary())))
    base = await _fixed_tokens(counter, layout, costs)
    if base > target_tokens:
        raise PlanningError(
            f"the canary's fixed text is {base} tokens, more than the {target_tokens} planned"
        )
    plan = _Plan(kind, marker, depth, ordered, layout, target_tokens, max_tokens, window)
    return await _steer(plan, counter, costs, base, rng, max_rounds)


def _layout(
    marker: str, depth: float, placements: Sequence[Placement]
) -> tuple[tuple[Placement, ...], Layout | MultiLayout]:
    """The placements a plan keeps (none for a single marker) and the layout they make."""
    ordered = tuple(sorted(placements, key=lambda p: p.depth))
    if len(ordered) <= 1:
        return (), Layout(marker, depth)
    if (ordered[0].marker, ordered[0].depth) != (marker, depth):
        raise ValueError("marker and depth must be the shallowest placement")
    return ordered, MultiLayout(ordered)


async def _fixed_tokens(counter: TokenCounter, layout: Layout | MultiLayout, costs: Costs) -> int:
    """What the prompt costs besides its filler, as the target counts it."""
    # The fixed text is counted with one filler piece in place, not with none: the text on
    # either side of an empty filler can merge into tokens that never occur in a real prompt.
    seed = costs.singles[0]
    seeds = [seed] * (layout.seed_pieces() if isinstance(layout, MultiLayout) else 1)
    return await counter.count_prompt(layout.messages(seeds)) - costs.of[seed] * len(seeds)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What a prompt is planned for; :meth:`prompt` makes it with the pieces chosen."""

    kind: ProbeKind
    marker: str
    depth: float
    placements: tuple[Placement, ...]
    layout: Layout | MultiLayout
    target_tokens: int
    max_tokens: int
    window: int | None

    def prompt(
        self,
        pieces: Sequence[str],
        counter: TokenCounter,
        *,
        planned: int,
        exact: bool,
        calls: int,
        note: str | None = None,
    ) -> PlannedPrompt:
        return PlannedPrompt(
            kind=self.kind,
            messages=self.layout.messages(pieces),
            marker=self.marker,
            planned_tokens=planned,
            target_tokens=self.target_tokens,
            exact=exact,
            tolerance=counter.tolerance(planned),
            max_tokens=self.max_tokens,
            tokenize_calls=calls,
            token_source=counter.source,
            marker_depth=self.depth,
            note=note,
            placements=self.placements,
            window=self.window,
        )


async def _steer(
    plan: _Plan,
    counter: TokenCounter,
    costs: Costs,
    base: int,
    rng: random.Random,
    max_rounds: int,
) -> PlannedPrompt:
    """Fill to the target, then count the whole prompt and correct it, up to ``max_rounds``
    times; the nearest acceptable count wins."""
    target_tokens, side = plan.target_tokens, side_for(plan.kind)
    pieces = _fill(target_tokens - base, costs, rng)
    best: tuple[int, list[str]] | None = None
    calls = 0
    for _ in range(max_rounds):
        total = await counter.count_prompt(plan.layout.messages(pieces))
        calls += 1
        text_tokens = sum(map(costs.of.__getitem__, pieces))
        if calls == 1 and template_swallows_content(base, total, text_tokens):
            # The serving stack's template drops the text, so its count cannot be steered.
            # Send the canary as sized by its content: the engine's usage will then show
            # how little of it was read (truncated), with the answer as evidence.
            return plan.prompt(
                pieces,
                counter,
                planned=base + text_tokens,
                exact=False,
                calls=calls,
                note=swallowed_reason(base, total, text_tokens),
            )
        fits = _fits(total, target_tokens, side, exact=counter.exact)
        if fits and (best is None or abs(target_tokens - total) < abs(target_tokens - best[0])):
            best = (total, list(pieces))
        diff = target_tokens - total
        if diff == 0 or (fits and not counter.exact):
            break
        pieces = _correct(pieces, diff, costs, rng)
    if best is None:
        raise PlanningError(
            f"could not size a {plan.kind} prompt to {side.value} {target_tokens} tokens "
            f"in {max_rounds} verifications"
        )
    total, chosen = best
    return plan.prompt(chosen, counter, planned=total, exact=counter.exact, calls=calls)


def _fits(total: int, target: int, side: Side, *, exact: bool) -> bool:
    # An estimate is steered like an exact count (calibrated, it is the best prediction
    # of the engine's count there is), but its pieces do not add up exactly (rounding),
    # so near is good enough: sizing left it a margin far wider than that.
    if exact:
        return _acceptable(total, target, side)
    return abs(target - total) <= _estimate_slack(target)


def _estimate_slack(target: int) -> int:
    """How near an estimated prompt must land to its target: 0.1 %, at least 2 tokens."""
    return max(2, target // 1000)


def _acceptable(total: int, target: int, side: Side) -> bool:
    return total <= target if side is Side.AT_MOST else total >= target


def _fill(need: int, costs: Costs, rng: random.Random) -> list[str]:
    """Whole pool sentences while they fit, then single-token words to land on ``need``."""
    pieces: list[str] = []
    have = 0
    texts, sentence_costs = costs.sentences, costs.sentence_costs
    indexes = range(len(texts))
    # Draw about as many sentences as should fit, a batch at a time; the last one that
    # does not fit ends the sentences (as the word-by-word generator did).
    while True:
        batch = rng.choices(indexes, k=max(1, (need - have) // costs.mean_sentence + 1))
        for i in batch:
            cost = sentence_costs[i]
            if have + cost > need:
                break
            pieces.append(texts[i])
            have += cost
        else:
            continue
        break
    while have < need:
        piece = rng.choice(costs.singles)
        pieces.append(piece)
        have += costs.of[piece]
    return pieces


def _correct(
    pieces: list[str],
    diff: int,
    costs: Costs,
    rng: random.Random,
) -> list[str]:
    """Add or drop trailing filler worth ``diff`` tokens by the cached piece counts."""
    pieces = list(pieces)
    if diff > 0:
        added = 0
        while added < diff:
            piece = rng.choice(costs.singles)
            pieces.append(piece)
            added += costs.of[piece]
        return pieces
    removed = 0
    while removed < -diff and pieces:
        removed += costs.of[pieces.pop()]
    # Dropping whole pieces may overshoot; give back single tokens.
    while removed > -diff:
        piece = rng.choice(costs.singles)
        pieces.append(piece)
        removed -= costs.of[piece]
    return pieces
