"""`kvwatch probe` reports each depth of a several-marker probe, and nothing new otherwise."""

from __future__ import annotations

from datetime import UTC, datetime

from kvwatch.canary.model import DepthOutcome, DepthResult, ProbeKind, Verdict
from kvwatch.cli import format_table, report_json
from kvwatch.probe.model import ProbeReport

DEPTHS = (
    DepthResult(0.0, "KVW-1111-1111-1111", DepthOutcome.MISSING),
    DepthResult(0.5, "KVW-2222-2222-2222", DepthOutcome.FOUND),
    DepthResult(1.0, "KVW-3333-3333-3333", DepthOutcome.FOUND),
)


def _report(depths: tuple[DepthResult, ...] = ()) -> ProbeReport:
    return ProbeReport(
        probe_id=3,
        endpoint="glm-prod",
        kind=ProbeKind.UNDER,
        verdict=Verdict.TRUNCATED,
        reason="engine read 6144 of 8144 prompt tokens: head lost (…)",
        status=200,
        planned_prompt_tokens=8144,
        reported_prompt_tokens=6144,
        marker="KVW-1111-1111-1111",
        marker_found=False,
        foreign=(),
        duration_seconds=1.0,
        confirms_probe_id=None,
        finished_at=datetime(2026, 12, 3, tzinfo=UTC),
        depths=depths,
    )


def test_the_json_lists_each_depth_and_the_table_counts_recalled_codes():
    """One object per depth in JSON; the MARKER cell says 2/3 found."""
    assert report_json(_report(DEPTHS))["depths"] == [
        {"depth": 0.0, "marker": "KVW-1111-1111-1111", "outcome": "missing"},
        {"depth": 0.5, "marker": "KVW-2222-2222-2222", "outcome": "found"},
        {"depth": 1.0, "marker": "KVW-3333-3333-3333", "outcome": "found"},
    ]
    assert "2/3 found" in format_table([_report(DEPTHS)]).splitlines()[1]


def test_a_single_marker_probe_prints_as_before():
    """No depths key and the old found/missing cell."""
    assert "depths" not in report_json(_report())
    assert "  missing  " in format_table([_report()]).splitlines()[1]
