"""Which probe runs next: pure rules over the probes a slot has run so far.

A scheduled slot starts with one probe of its kind. What follows depends only on the
verdicts so far and the endpoint's ``confirm`` setting, so it is decided here, once, and the
runner only asks :func:`next_step`: a probe whose estimated size missed its boundary is
re-planned (up to :data:`MAX_RESIZES` times), a critical verdict is re-checked by a
confirmation probe (DESIGN §2), and a capacity mismatch goes on to the edge probe, just over
the KV pool, where the incident class lives. A chain that ends in a confirmed window failure
starts the served-window search (:func:`starts_search`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvwatch.canary.model import SEVERITY, ProbeKind, Severity, Verdict

# The kinds whose failures say the window is not served whole: the ones the served-window
# search follows, and whose alerts carry its result.
WINDOW_KINDS = frozenset({ProbeKind.UNDER, ProbeKind.EDGE})
# The kinds that rotate through an endpoint's tenants: the canaries that fill the KV cache
# (under) or probe past it (edge), where one request's pages can reach another's answer, and
# the cache probe (a cycle follows another tenant's, whose documents the cache holds).
TENANT_KINDS = WINDOW_KINDS | {ProbeKind.CACHE}

# Re-plans of a probe whose estimated size missed its boundary, within one slot: each uses
# what the miss taught (the engine's count, a wider margin), so a second is rare.
MAX_RESIZES = 2

# Verdicts that say the window is not served whole. Errors, throttling and credentials say
# nothing about the window; a model that cannot recall at all is the baseline's business.
WINDOW_FAILURES = frozenset(
    {
        Verdict.TRUNCATED,
        Verdict.UNDER_REJECTED,
        Verdict.MARKER_MISSING,
        Verdict.FOREIGN_MARKER,
        # Stale pages served across tenants: the same broken window, seen by a customer.
        Verdict.CROSS_TENANT_LEAK,
        Verdict.STREAM_ERROR,
        Verdict.WRONG_REJECTION,  # edge: a 5xx just over the KV pool
    }
)

# Seconds a slot claim outlives its probes' deadlines: start-up, planning and the writes.
CLAIM_MARGIN_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Link:
    """A finished probe as the chain sees it."""

    kind: ProbeKind
    verdict: Verdict
    confirming: bool = False  # it re-checked the probe before it
    attempt: int = 0  # re-plans after a sizing miss before it


@dataclass(frozen=True, slots=True)
class Step:
    """The next probe to run: its kind, whether it confirms the last one, its re-plan number."""

    kind: ProbeKind
    confirming: bool = False
    attempt: int = 0


def needs_confirmation(verdict: Verdict, confirm: bool) -> bool:
    """Whether a first probe with ``verdict`` is re-checked by a confirmation probe."""
    return confirm and SEVERITY[verdict] is Severity.CRITICAL


def goes_to_edge(kind: ProbeKind, verdict: Verdict) -> bool:
    """Whether a probe goes on to the edge probe: a capacity check that found the KV pool
    smaller than the window."""
    return kind is ProbeKind.CAPACITY and verdict is Verdict.CAPACITY_MISMATCH


def next_step(chain: Sequence[Link], *, confirm: bool) -> Step | None:
    """The probe to run after ``chain`` (a slot's probes so far, in order); None: done."""
    if not chain:
        return None
    last = chain[-1]
    if last.verdict is Verdict.SIZING_MISS and not last.confirming and last.attempt < MAX_RESIZES:
        return Step(last.kind, attempt=last.attempt + 1)
    if not last.confirming and needs_confirmation(last.verdict, confirm):
        return Step(last.kind, confirming=True)
    if goes_to_edge(last.kind, last.verdict):
        return Step(ProbeKind.EDGE)
    return None


def is_last(link: Link, *, confirm: bool) -> bool:
    """Whether no probe follows ``link``: its result completes the slot."""
    return next_step((link,), confirm=confirm) is None


def is_window_failure(kind: ProbeKind, verdict: Verdict) -> bool:
    """Whether a ``kind`` probe's ``verdict`` says the window is not served whole. An under
    probe's 5xx is an engine error, not a window (only the edge expects a 4xx there)."""
    if kind not in WINDOW_KINDS or verdict not in WINDOW_FAILURES:
        return False
    return not (kind is ProbeKind.UNDER and verdict is Verdict.WRONG_REJECTION)


def starts_search(link: Link, *, confirm: bool, planned: bool) -> bool:
    """Whether a chain ending in ``link`` (a planned probe, or not) is a confirmed window
    failure: the trigger of a served-window search.

    A critical verdict is confirmed by its confirmation probe (when confirmation is on); a
    warning stands on its own (a context-length rejection is deterministic).
    """
    if not planned or not is_window_failure(link.kind, link.verdict):
        return False
    critical = SEVERITY[link.verdict] is Severity.CRITICAL
    return not (critical and confirm and not link.confirming)


def claim_ttl(timeout: float) -> float:
    """How long a slot claim lasts: long enough for a probe and its confirmation, each up to
    its ``timeout``."""
    return 2 * timeout + CLAIM_MARGIN_SECONDS
