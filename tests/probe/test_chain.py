"""The chain's rules, over every combination of kind, verdict and position in the chain."""

from __future__ import annotations

import itertools

import pytest

from kvwatch.canary.model import SEVERITY, ProbeKind, Severity, Verdict
from kvwatch.probe.chain import (
    MAX_RESIZES,
    TENANT_KINDS,
    WINDOW_FAILURES,
    WINDOW_KINDS,
    Link,
    Step,
    claim_ttl,
    goes_to_edge,
    is_last,
    is_window_failure,
    needs_confirmation,
    next_step,
    starts_search,
)

K, V = ProbeKind, Verdict

# (kind, verdict, confirming, attempt, confirm enabled) → the step after it.
TABLE: list[tuple[ProbeKind, Verdict, bool, int, bool, Step | None]] = [
    (K.UNDER, V.PASS, False, 0, True, None),
    (K.UNDER, V.TRUNCATED, False, 0, True, Step(K.UNDER, confirming=True)),
    (K.UNDER, V.TRUNCATED, False, 0, False, None),
    (K.UNDER, V.TRUNCATED, True, 0, True, None),
    (K.UNDER, V.UNDER_REJECTED, False, 0, True, None),  # a warning is not re-checked
    (K.UNDER, V.SIZING_MISS, False, 0, True, Step(K.UNDER, attempt=1)),
    (K.UNDER, V.SIZING_MISS, False, 1, True, Step(K.UNDER, attempt=2)),
    (K.UNDER, V.SIZING_MISS, False, MAX_RESIZES, True, None),
    (K.UNDER, V.SIZING_MISS, True, 0, True, None),  # a confirmation is never re-planned
    (K.UNDER, V.MARKER_MISSING, False, 1, True, Step(K.UNDER, confirming=True)),
    (K.OVER, V.OVER_ACCEPTED, False, 0, True, Step(K.OVER, confirming=True)),
    (K.OVER, V.SIZING_MISS, False, 0, False, Step(K.OVER, attempt=1)),
    (K.BASELINE, V.CANARY_INEFFECTIVE, False, 0, True, None),  # a warning
    (K.CAPACITY, V.PASS, False, 0, True, None),
    (K.CAPACITY, V.CAPACITY_MISMATCH, False, 0, True, Step(K.CAPACITY, confirming=True)),
    (K.CAPACITY, V.CAPACITY_MISMATCH, True, 0, True, Step(K.EDGE)),
    (K.CAPACITY, V.CAPACITY_MISMATCH, False, 0, False, Step(K.EDGE)),
    (K.EDGE, V.MARKER_MISSING, False, 0, True, Step(K.EDGE, confirming=True)),
    (K.EDGE, V.WRONG_REJECTION, False, 0, True, None),  # a warning
    (K.EDGE, V.PASS, False, 0, True, None),
    (K.BISECT, V.TRUNCATED, False, 0, False, None),
]


@pytest.mark.parametrize(("kind", "verdict", "confirming", "attempt", "confirm", "step"), TABLE)
def test_the_step_after_a_probe_is_the_one_in_the_table(
    kind: ProbeKind,
    verdict: Verdict,
    confirming: bool,
    attempt: int,
    confirm: bool,
    step: Step | None,
) -> None:
    """Each row: the probe so far and what runs next."""
    assert next_step([Link(kind, verdict, confirming, attempt)], confirm=confirm) == step


def _expected(link: Link, confirm: bool) -> Step | None:
    """The rules as the runner applied them before they were a module of their own."""
    critical = SEVERITY[link.verdict] is Severity.CRITICAL
    if link.verdict is V.SIZING_MISS and not link.confirming and link.attempt < MAX_RESIZES:
        return Step(link.kind, attempt=link.attempt + 1)
    if not link.confirming and confirm and critical:
        return Step(link.kind, confirming=True)
    if link.kind is K.CAPACITY and link.verdict is V.CAPACITY_MISMATCH:
        return Step(K.EDGE)
    return None


EVERY_LINK = [
    (Link(kind, verdict, confirming, attempt), confirm)
    for kind, verdict, confirming, attempt, confirm in itertools.product(
        ProbeKind, Verdict, (False, True), range(MAX_RESIZES + 1), (False, True)
    )
]


def test_every_combination_follows_the_rules_and_ends_a_slot_exactly_when_nothing_follows() -> None:
    """For all kinds × verdicts × positions × confirm settings: next step, and is_last."""
    for link, confirm in EVERY_LINK:
        expected = _expected(link, confirm)
        assert next_step([link], confirm=confirm) == expected, (link, confirm)
        assert is_last(link, confirm=confirm) is (expected is None), (link, confirm)


def test_only_the_last_probe_of_a_chain_decides_what_follows() -> None:
    """Earlier links do not change the step: the chain is read from its end."""
    first = Link(K.UNDER, V.SIZING_MISS)
    for link, confirm in EVERY_LINK:
        assert next_step([first, link], confirm=confirm) == next_step([link], confirm=confirm)


def test_an_empty_chain_has_no_next_step() -> None:
    """Nothing ran, nothing follows."""
    assert next_step([], confirm=True) is None


def test_every_chain_ends() -> None:
    """Following next_step from any first probe whose verdict repeats stops within a few
    steps: re-plans are bounded, a confirmation is not confirmed, the edge has no edge."""
    for kind, verdict, confirm in itertools.product(ProbeKind, Verdict, (False, True)):
        chain = [Link(kind, verdict)]
        while (step := next_step(chain, confirm=confirm)) is not None:
            chain.append(Link(step.kind, verdict, step.confirming, step.attempt))
            assert len(chain) <= 2 * (MAX_RESIZES + 2), chain


def test_confirmation_needs_the_setting_and_a_critical_verdict() -> None:
    """needs_confirmation is exactly confirm ∧ critical."""
    for verdict, confirm in itertools.product(Verdict, (False, True)):
        critical = SEVERITY[verdict] is Severity.CRITICAL
        assert needs_confirmation(verdict, confirm) is (confirm and critical)


def test_only_a_capacity_mismatch_goes_to_the_edge() -> None:
    """goes_to_edge over every kind and verdict."""
    for kind, verdict in itertools.product(ProbeKind, Verdict):
        assert goes_to_edge(kind, verdict) is (
            kind is K.CAPACITY and verdict is V.CAPACITY_MISMATCH
        )


def test_window_failures_are_under_and_edge_verdicts_about_the_window() -> None:
    """is_window_failure over every kind and verdict: an under probe's 5xx is not one."""
    for kind, verdict in itertools.product(ProbeKind, Verdict):
        expected = (
            kind in (K.UNDER, K.EDGE)
            and verdict in WINDOW_FAILURES
            and not (kind is K.UNDER and verdict is V.WRONG_REJECTION)
        )
        assert is_window_failure(kind, verdict) is expected, (kind, verdict)


def test_a_search_starts_after_a_confirmed_or_a_warning_window_failure_of_a_planned_probe() -> None:
    """starts_search over every link: planned, a window failure, and confirmed if critical."""
    for (link, confirm), planned in itertools.product(EVERY_LINK, (False, True)):
        critical = SEVERITY[link.verdict] is Severity.CRITICAL
        expected = (
            planned
            and is_window_failure(link.kind, link.verdict)
            and not (critical and confirm and not link.confirming)
        )
        assert starts_search(link, confirm=confirm, planned=planned) is expected


def test_the_window_kinds_are_under_and_edge_and_the_cache_probe_also_rotates_tenants() -> None:
    """The one definition of {under, edge}; the cache probe's slots rotate tenants too."""
    assert {K.UNDER, K.EDGE} == WINDOW_KINDS
    assert {K.UNDER, K.EDGE, K.CACHE} == TENANT_KINDS


def test_a_claim_lasts_two_deadlines_and_a_margin() -> None:
    """Long enough for a probe and its confirmation."""
    assert claim_ttl(60.0) == 150.0
