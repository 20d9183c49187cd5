"""`kvwatch probe` output names the tenant a probe was sent as, and only when there is one."""

from __future__ import annotations

from datetime import UTC, datetime

from kvwatch.canary.model import ForeignMarker, ProbeKind, Verdict
from kvwatch.cli import format_table, gate_passes, report_json
from kvwatch.probe.model import ProbeReport

AT = datetime(2026, 12, 3, 5, 0, tzinfo=UTC)


def report(tenant: str | None, verdict: Verdict = Verdict.PASS, **kw: object) -> ProbeReport:
    values: dict[str, object] = {
        "probe_id": 7,
        "endpoint": "shared",
        "kind": ProbeKind.UNDER,
        "verdict": verdict,
        "reason": "marker recalled",
        "status": 200,
        "planned_prompt_tokens": 8160,
        "reported_prompt_tokens": 8160,
        "marker": "KVW-AAAA-BBBB-CCCC",
        "marker_found": True,
        "foreign": (),
        "duration_seconds": 0.5,
        "confirms_probe_id": None,
        "finished_at": AT,
        "tenant": tenant,
        **kw,
    }
    return ProbeReport(**values)  # type: ignore[arg-type]


def test_the_table_has_a_tenant_column_only_for_tenant_probes() -> None:
    """Endpoints without tenants print exactly the old table."""
    plain = format_table([report(None)]).splitlines()[0].split()
    assert "TENANT" not in plain
    tenanted = format_table([report("globex"), report(None)]).splitlines()
    assert tenanted[0].split()[:5] == ["ID", "ENDPOINT", "KIND", "TENANT", "VERDICT"]
    assert tenanted[1].split()[3] == "globex" and tenanted[2].split()[3] == "-"


def test_json_names_the_tenant_and_the_tenant_of_each_leaked_marker() -> None:
    """One object per probe, with ``tenant`` on it and on its foreign markers."""
    leak = ForeignMarker("KVW-DDDD-EEEE-FFFF", 3, "shared", AT, tenant="acme")
    body = report_json(report("globex", Verdict.CROSS_TENANT_LEAK, foreign=(leak,)))
    assert (body["tenant"], body["verdict"]) == ("globex", "cross_tenant_leak")
    assert [(f["probe_id"], f["tenant"]) for f in body["foreign_markers"]] == [(3, "acme")]


def test_the_gate_judges_a_re_planned_sizing_miss_by_its_re_plan() -> None:
    """A sizing miss followed by its re-plan passes the gate when the re-plan passes; one
    left standing (the boundary untested) fails it, as does a failing re-plan."""
    miss = report(None, Verdict.SIZING_MISS, kind=ProbeKind.OVER, probe_id=None)
    replan = report(None, Verdict.PASS, kind=ProbeKind.OVER, probe_id=None)
    baseline = report(None, Verdict.PASS, kind=ProbeKind.BASELINE)
    assert gate_passes([miss, replan, baseline])
    assert not gate_passes([miss, baseline])
    assert not gate_passes([miss, report(None, Verdict.OVER_ACCEPTED, kind=ProbeKind.OVER)])
    assert not gate_passes([])


def test_kvwatch_show_lists_a_control_as_its_member_alone() -> None:
    """A burst's control prints as "N alone" after the burst's members, not as a member."""
    from kvwatch.cli import _burst_lines
    from kvwatch.web.schemas import BurstRequest

    def request(index: int, size: int, outcome: str, *, control: bool = False) -> BurstRequest:
        return BurstRequest(
            request=index,
            size=size,
            control=control,
            marker="KVW-AAAA-BBBB-CCCC",
            expected="fox",
            answered="fox",
            marker_found=outcome == "right",
            outcome=outcome,
            siblings=[],
            foreign_probe_ids=[],
            status=200,
            prompt_tokens=128,
            completion_tokens=20,
            detail=None,
            answer=None,
        )

    lines = _burst_lines(
        [request(0, 1, "right"), request(1, 3, "wrong"), request(1, 1, "wrong", control=True)]
    )
    assert [line.split()[1:3] for line in lines] == [
        ["solo", "KVW-AAAA-BBBB-CCCC"],
        ["1", "of"],
        ["1", "alone"],
    ]
