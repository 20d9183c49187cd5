"""One probe result, and the records derived from it agree with it and with each other."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client import CollectorRegistry

from kvwatch.canary.model import (
    Exchange,
    ForeignMarker,
    Judgement,
    Message,
    PlannedPrompt,
    ProbeKind,
    Verdict,
)
from kvwatch.limits import STORED_ERROR_CHARS
from kvwatch.metrics import ProbeMetrics
from kvwatch.probe.result import Attempt, ProbeResult
from kvwatch.store.records import NewProbe

STARTED = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
LEAKED = ForeignMarker("KVW-DDDD-DDDD-DDDD", 7, "ep", STARTED, tenant="globex")


def _result(kind: ProbeKind = ProbeKind.UNDER, *, probe_id: int | None = 41) -> ProbeResult:
    new = NewProbe(
        endpoint="ep",
        endpoint_id=1,
        kind=kind.value,
        started_at=STARTED,
        replica="r1",
        model="m",
        planned_prompt_tokens=8000,
        target_prompt_tokens=8000,
        max_tokens=32,
        token_source="server",
        tokenize_calls=1,
        marker="KVW-AAAA-AAAA-AAAA",
        marker_depth=0.5,
        streamed=True,
        slot=900,
        tenant="acme",
    )
    plan = PlannedPrompt(
        kind=kind,
        messages=(Message("user", "…"),),
        marker="KVW-AAAA-AAAA-AAAA",
        planned_tokens=8000,
        target_tokens=8000,
        exact=True,
        tolerance=0,
        max_tokens=32,
        tokenize_calls=1,
    )
    exchange = Exchange(
        status=200,
        answer="KVW-DDDD-DDDD-DDDD",
        prompt_tokens=8000,
        completion_tokens=9,
        error_body="x" * (STORED_ERROR_CHARS + 10),
        total_seconds=1.23456,
    )
    judgement = Judgement(
        Verdict.CROSS_TENANT_LEAK,
        "leak",
        foreign=[LEAKED],
        crossed=(LEAKED,),
    )
    attempt = Attempt(new, probe_id, plan, exchange, judgement)
    return ProbeResult(attempt, kind, "m", STARTED + timedelta(seconds=2), probe_id)


def test_the_report_the_outcome_and_the_log_line_state_the_same_facts() -> None:
    """Verdict, reason, tokens and the leaked marker agree across the derived records."""
    result = _result()
    report, outcome = result.report(), result.outcome(400)
    line = result.log_fields(write_seconds=0.01, scheduled=STARTED - timedelta(seconds=1))
    assert report.verdict.value == outcome.verdict == line["verdict"] == "cross_tenant_leak"
    assert report.reason == outcome.reason == line["reason"] == "leak"
    assert report.planned_prompt_tokens == outcome.planned_prompt_tokens == 8000
    assert report.reported_prompt_tokens == outcome.reported_prompt_tokens == 8000
    assert report.foreign == (LEAKED,) and outcome.foreign_markers == [LEAKED]
    assert line["foreign_probe_ids"] == [7] and line["foreign_tenants"] == ["globex"]
    assert (line["lag_seconds"], line["slot"], line["tenant"]) == (1.0, 900, "acme")


def test_error_bodies_are_bounded_alike_in_the_report_and_the_stored_outcome() -> None:
    """One limit for what is stored and reported of an error body."""
    result = _result()
    assert result.report().error_body == result.outcome(400).error_body
    assert len(result.outcome(400).error_body or "") == STORED_ERROR_CHARS + 1


def test_an_excerpt_limit_of_zero_stores_no_answer() -> None:
    """Answer excerpts can be switched off: they may hold other users' data."""
    assert _result().outcome(0).answer_excerpt is None


def test_a_cross_tenant_leak_is_counted_with_both_tenants() -> None:
    """The leak gauge names the source tenant the judgement found and the probe's tenant."""
    registry = CollectorRegistry()
    _result().observe(ProbeMetrics(registry))
    labels = {"endpoint": "ep", "probe": "under", "source_tenant": "globex", "tenant": "acme"}
    leak = registry.get_sample_value("kvwatch_cross_tenant_leak_timestamp_seconds", labels)
    assert leak == (STARTED + timedelta(seconds=2)).timestamp()


def test_a_bisect_step_counts_tokens_but_sets_no_verdict_gauge() -> None:
    """A search step is evidence, not the endpoint's state."""
    registry = CollectorRegistry()
    _result(ProbeKind.BISECT).observe(ProbeMetrics(registry))
    names = {s.name for m in registry.collect() for s in m.samples if s.labels.get("probe")}
    assert "kvwatch_canary_tokens_total" in names
    assert not any("verdict" in n or "success" in n or "last_run" in n for n in names)


def test_a_result_written_late_reports_its_stored_id_but_logs_none() -> None:
    """The log line says what was known when it was written; the report has the row's id."""
    late = _result(probe_id=None)
    stored = ProbeResult(late.attempt, late.kind, late.model, late.finished_at, 99)
    assert stored.report().probe_id == 99
    assert stored.log_fields(write_seconds=0.0, scheduled=None)["probe_id"] is None
