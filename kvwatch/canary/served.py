"""The true served window (issue 12): which prompt size to try next, and when to stop. Pure.

After a window failure (``truncated``, ``under_rejected``, a failing edge probe) on-call's
first question is "what does it really serve?". The answer is the largest prompt the endpoint
serves *whole* (2xx, marker recalled, every planned token reported), somewhere between the
last size known to pass and the size that just failed.

Every probe here is a full prefill, so cost is the point. The engine usually says where its
limit is: a truncated answer reports the prompt tokens it actually read, a context-length
rejection often names the window, and the capacity check knows the KV pool. Such a *hint* is
only a candidate, so each is verified by two probes: the candidate must be served whole and
one token more must not be. And only a size that could be the answer is a candidate: one a
canary can be planned at (:func:`kvwatch.canary.planning.smallest_canary`), above the last
size known to pass and below the smallest known to fail. Anything else is dropped unprobed:
an engine that swaps the prompt for a one-token placeholder reports 1, which no canary can
be planned at, and probing it would stop the search, not inform it. Only when there is no
(more) believable hint does the search bisect, down to ``RESOLUTION`` tokens, which the
budget of ``⌈log2(window / 1024)⌉ + 1`` probes allows from any starting bracket inside the
window.

The search never concludes beyond its evidence: ``served`` is always a size a probe (or the
caller's last passing probe) proved whole, and ``unserved`` one a probe proved not whole.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass

from kvwatch.canary.planning import smallest_canary

# Bisection stops when the served limit is bracketed this tightly: ten halvings of a
# 1,048,576-token window. Engines' own hints are checked to the token.
RESOLUTION = 1024


def probe_budget(window: int) -> int:
    """Probes one search may spend: ``⌈log2(window / 1024)⌉ + 1`` (at least 1)."""
    if window <= RESOLUTION:
        return 1
    return math.ceil(math.log2(window / RESOLUTION)) + 1


@dataclass(frozen=True, slots=True)
class Observation:
    """One probe's outcome as the search needs it."""

    size: int  # prompt tokens the probe carried (as planned)
    whole: bool  # served whole: 2xx, marker recalled, reported = planned
    # The largest prompt the engine's own signal says it serves (a truncated answer's reported
    # prompt tokens, a rejection's stated limit): a candidate to verify, never a conclusion.
    hint: int | None = None


@dataclass(frozen=True, slots=True)
class ServedSearch:
    """The state of one search: the bracket, the hints still to check, the probes spent."""

    served: int  # the largest size proved whole
    unserved: int  # the smallest size proved not whole
    budget: int
    # The smallest size a canary can be planned at, raised past any size the planner
    # refused: nothing below it is probed.
    floor: int = 1
    spent: int = 0
    hints: tuple[int, ...] = ()  # unverified candidates, in the order they arrived
    hinted: frozenset[int] = frozenset()  # every hint ever given
    tried: frozenset[int] = frozenset()  # sizes already probed (a hint never repeats one)

    @property
    def exact(self) -> bool:
        """The limit is known to the token: ``served`` passed and ``served + 1`` did not."""
        return self.unserved - self.served <= 1

    @property
    def resolved(self) -> bool:
        """Known to the resolution bisection aims for (or to the token)."""
        return self.unserved - self.served <= RESOLUTION

    def probeable(self, size: int) -> bool:
        """Whether a probe of ``size`` can be planned and can still move the bracket."""
        return max(self.served, self.floor - 1) < size < self.unserved


def start(
    *,
    served: int,
    unserved: int,
    window: int,
    hints: Iterable[int | None] = (),
    floor: int | None = None,
) -> ServedSearch:
    """A search between ``served`` (last size known to pass) and ``unserved`` (the size that
    just failed), for an endpoint advertising ``window``. ``hints`` are candidates from the
    failure itself and the engine's self-report (its KV pool), most trusted first; those that
    cannot be the answer are dropped. ``floor`` is the smallest size a canary can be planned
    at (default: :func:`~kvwatch.canary.planning.smallest_canary` for one marker)."""
    if not 0 <= served < unserved:
        raise ValueError(f"need 0 <= served ({served}) < unserved ({unserved})")
    floor = smallest_canary() if floor is None else max(1, floor)
    if served > 0:
        # A canary of that size was planned and passed: the planner fits one just above it,
        # whatever the general bound says.
        floor = min(floor, served + 1)
    state = ServedSearch(served=served, unserved=unserved, budget=probe_budget(window), floor=floor)
    for hint in hints:
        state = _with_hint(state, hint)
    return state


def next_size(state: ServedSearch) -> int | None:
    """The prompt size to probe next, or ``None`` when the search is over."""
    if state.exact or state.spent >= state.budget:
        return None
    # A hint that just proved whole is only the limit if one token more is not served.
    above = state.served + 1
    if state.served in state.hinted and above not in state.tried and state.probeable(above):
        return above
    for hint in state.hints:
        if state.probeable(hint) and hint not in state.tried:
            return hint
    if state.resolved:
        return None
    # Halfway between the sizes probes can still tell apart: above the largest served whole
    # and at or above the floor (below it no canary can be planned), below the smallest not.
    middle = (max(state.served, state.floor - 1) + state.unserved) // 2
    return middle if state.probeable(middle) and middle not in state.tried else None


def observe(state: ServedSearch, obs: Observation) -> ServedSearch:
    """Fold one probe's outcome into the search."""
    state = dataclasses.replace(
        state,
        spent=state.spent + 1,
        tried=state.tried | {obs.size},
        hints=tuple(h for h in state.hints if h != obs.size),
    )
    # The search's premise is monotony: a size served whole means every smaller one is. An
    # outcome outside the bracket contradicts earlier evidence (a flaky engine): it moves
    # nothing, so what is reported stays proved by a probe.
    inside = state.served < obs.size < state.unserved
    if obs.whole and inside:
        state = dataclasses.replace(state, served=obs.size)
    elif not obs.whole:
        if inside:
            state = dataclasses.replace(state, unserved=obs.size)
        state = _with_hint(state, obs.hint)
    return _drop_stale_hints(state)


def unplannable(state: ServedSearch, size: int) -> ServedSearch:
    """Fold in a step of ``size`` that could not be planned: kvwatch's own limit, not the
    engine's, so the bracket stays as it is. No size at or below it is tried again (the
    planner refuses a prompt too small for the canary's fixed text, and so every smaller
    one); the step counts against the budget, so a planner that refuses everything ends the
    search with what was proved instead of looping."""
    state = dataclasses.replace(
        state,
        spent=state.spent + 1,
        tried=state.tried | {size},
        floor=max(state.floor, size + 1),
    )
    return _drop_stale_hints(state)


def _with_hint(state: ServedSearch, hint: int | None) -> ServedSearch:
    if hint is None or hint in state.hinted:
        return state
    hinted = state.hinted | {hint}
    # Below the floor (a placeholder's 1, a stated limit of 0), at or under a size already
    # served whole, at or over one already refused (more than the window): not the answer.
    if not state.probeable(hint):
        return dataclasses.replace(state, hinted=hinted)
    return dataclasses.replace(state, hints=(*state.hints, hint), hinted=hinted)


def _drop_stale_hints(state: ServedSearch) -> ServedSearch:
    """Forget candidates the bracket or the floor has moved past: they never come back in."""
    kept = tuple(h for h in state.hints if state.probeable(h))
    return state if kept == state.hints else dataclasses.replace(state, hints=kept)


__all__ = [
    "RESOLUTION",
    "Observation",
    "ServedSearch",
    "next_size",
    "observe",
    "probe_budget",
    "start",
    "unplannable",
]
