"""A marker issued under one tenant in an answer given to another: ``cross_tenant_leak``."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from kvwatch.canary.edge import judge_edge
from kvwatch.canary.model import SEVERITY, ForeignMarker, ProbeKind, Severity, Verdict
from kvwatch.canary.verdicts import cross_tenant_markers, judge
from tests.canary.test_verdicts import MARKER, ok, plan, rejected

ISSUED = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)


def leaked(tenant: str | None, probe_id: int = 41) -> ForeignMarker:
    return ForeignMarker("KVW-2222-3333-4444", probe_id, "glm-prod", ISSUED, tenant=tenant)


@pytest.mark.parametrize(
    ("own", "source", "expected"),
    [
        ("globex", "acme", Verdict.CROSS_TENANT_LEAK),
        ("acme", "acme", Verdict.FOREIGN_MARKER),
        (None, "acme", Verdict.FOREIGN_MARKER),
        ("globex", None, Verdict.FOREIGN_MARKER),
        (None, None, Verdict.FOREIGN_MARKER),
    ],
)
def test_only_a_marker_of_another_named_tenant_is_a_cross_tenant_leak(
    own: str | None, source: str | None, expected: Verdict
) -> None:
    """Both tenants named and different: cross-tenant; anything else stays foreign_marker."""
    answer = "KVW-2222-3333-4444"
    judgement = judge(plan(), ok(answer=answer), [leaked(source)], tenant=own)
    assert judgement.verdict is expected


def test_the_reason_names_both_tenants_and_the_source_probe() -> None:
    """The on-call reads who received whose data, and which probe it came from."""
    judgement = judge(plan(), ok(), [leaked("acme", probe_id=4711)], tenant="globex")
    assert judgement.verdict is Verdict.CROSS_TENANT_LEAK
    assert "tenant globex" in judgement.reason
    assert "tenant acme" in judgement.reason
    assert "probe 4711" in judgement.reason


def test_a_cross_tenant_marker_wins_over_a_same_tenant_one_listed_first() -> None:
    """Several foreign markers: one crossing tenants decides, whatever the order."""
    foreign = [leaked("globex", probe_id=1), leaked("acme", probe_id=2)]
    judgement = judge(plan(), ok(), foreign, tenant="globex")
    assert judgement.verdict is Verdict.CROSS_TENANT_LEAK
    assert "probe 2" in judgement.reason
    assert [f.probe_id for f in judgement.foreign] == [1, 2]  # all kept as evidence


@pytest.mark.parametrize("kind", [ProbeKind.UNDER, ProbeKind.OVER, ProbeKind.BASELINE])
def test_a_cross_tenant_leak_is_judged_on_every_probe_kind(kind: ProbeKind) -> None:
    """Like foreign_marker, it is checked before anything the kind decides."""
    judgement = judge(plan(kind), ok(answer=MARKER), [leaked("acme")], tenant="globex")
    assert judgement.verdict is Verdict.CROSS_TENANT_LEAK


def test_an_edge_probe_names_a_cross_tenant_leak_too() -> None:
    """The edge probe (over the KV pool) is where the incident leaked; it must say so."""
    edge_plan = dataclasses.replace(plan(), kind=ProbeKind.EDGE)
    judgement = judge_edge(edge_plan, ok(), [leaked("acme")], tenant="globex")
    assert judgement.verdict is Verdict.CROSS_TENANT_LEAK


def test_transport_auth_and_throttling_are_decided_before_a_leak() -> None:
    """No answer was read, so no leak can be claimed: the usual verdicts stand."""
    assert judge(plan(), rejected(401), [leaked("acme")], tenant="globex").verdict is (
        Verdict.AUTH_ERROR
    )
    assert judge(plan(), rejected(429), [leaked("acme")], tenant="globex").verdict is (
        Verdict.THROTTLED
    )


def test_cross_tenant_leak_is_critical() -> None:
    """It pages: one customer's data reached another."""
    assert SEVERITY[Verdict.CROSS_TENANT_LEAK] is Severity.CRITICAL


def test_cross_tenant_markers_keeps_only_other_named_tenants() -> None:
    """The helper behind the verdict, on its own."""
    foreign = [leaked("acme"), leaked(None), leaked("globex")]
    assert cross_tenant_markers(foreign, "globex") == [foreign[0]]
    assert cross_tenant_markers(foreign, None) == []
