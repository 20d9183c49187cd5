"""One finished probe, and everything derived from it.

A probe's facts are gathered once, in :class:`ProbeResult`: what was written at its start
(:class:`NewProbe`), what was planned, what came over the wire and the verdict. The stored
outcome, the report the CLI and alerting read, the metrics and the ``probe`` log line are
each derived from it here, so they cannot disagree.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kvwatch.canary.model import Exchange, Judgement, PlannedPrompt, ProbeKind, Verdict
from kvwatch.limits import STORED_ERROR_CHARS, bounded
from kvwatch.metrics import ProbeMetrics
from kvwatch.probe.model import ProbeReport
from kvwatch.store.records import NewProbe, ProbeOutcome


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one probe did before its result is stored: the row written at its start (with
    what planning settled), its id, the plan if there was one, the exchange and verdict."""

    new: NewProbe
    probe_id: int | None
    plan: PlannedPrompt | None
    exchange: Exchange
    judgement: Judgement


@dataclass(frozen=True, slots=True)
class ProbeResult:
    attempt: Attempt
    kind: ProbeKind
    model: str
    finished_at: datetime
    probe_id: int | None  # the stored id: the attempt's, or the one given when written late

    @property
    def verdict(self) -> Verdict:
        return self.attempt.judgement.verdict

    def report(self) -> ProbeReport:
        a = self.attempt
        ex, j, plan = a.exchange, a.judgement, a.plan
        return ProbeReport(
            probe_id=self.probe_id,
            endpoint=a.new.endpoint,
            kind=self.kind,
            verdict=j.verdict,
            reason=j.reason,
            status=ex.status,
            planned_prompt_tokens=plan.planned_tokens if plan else None,
            reported_prompt_tokens=ex.prompt_tokens,
            marker=plan.marker if plan else None,
            marker_found=j.marker_found,
            foreign=tuple(j.foreign),
            duration_seconds=ex.total_seconds,
            confirms_probe_id=a.new.confirms_probe_id,
            finished_at=self.finished_at,
            tenant=a.new.tenant,
            error_body=bounded(ex.error_body, STORED_ERROR_CHARS),
            trigger_probe_id=a.new.trigger_probe_id,
            depths=tuple(j.depths),
            trace_id=a.new.trace_id,
        )

    def outcome(self, excerpt_chars: int) -> ProbeOutcome:
        """What is stored with the probe row; ``excerpt_chars`` of the answer (0: none)."""
        a = self.attempt
        ex, j, new = a.exchange, a.judgement, a.new
        return ProbeOutcome(
            verdict=j.verdict.value,
            reason=j.reason,
            finished_at=self.finished_at,
            reported_prompt_tokens=ex.prompt_tokens,
            completion_tokens=ex.completion_tokens,
            cached_prompt_tokens=ex.cached_prompt_tokens,
            marker_found=j.marker_found if a.plan else None,
            foreign_markers=j.foreign,
            http_status=ex.status,
            finish_reason=ex.finish_reason,
            answer_excerpt=bounded(ex.answer, excerpt_chars),
            error_body=bounded(ex.error_body, STORED_ERROR_CHARS),
            error_detail=bounded(ex.error_detail, STORED_ERROR_CHARS),
            ttfb_seconds=ex.ttfb_seconds,
            duration_seconds=ex.total_seconds,
            depths=tuple(j.depths),
            burst=tuple(
                dataclasses.replace(r, answer=bounded(r.answer, excerpt_chars)) for r in j.burst
            ),
            cache=tuple(
                dataclasses.replace(c, answer=bounded(c.answer, excerpt_chars)) for c in j.cache
            ),
            planned_prompt_tokens=new.planned_prompt_tokens,
            target_prompt_tokens=new.target_prompt_tokens,
            tokenize_calls=new.tokenize_calls,
            marker_depth=new.marker_depth,
            token_source=new.token_source,
        )

    def observe(self, metrics: ProbeMetrics) -> None:
        """Count the result in the probe metrics."""
        a = self.attempt
        ex, j, endpoint, kind = a.exchange, a.judgement, a.new.endpoint, self.kind.value
        if self.kind is ProbeKind.BISECT:
            # A search step's verdict is evidence, not the endpoint's state: tokens only.
            metrics.observe_tokens(
                endpoint=endpoint,
                kind=kind,
                reported=ex.prompt_tokens,
                completion=ex.completion_tokens,
            )
        else:
            metrics.observe(
                endpoint=endpoint,
                kind=kind,
                verdict=j.verdict,
                finished_at=self.finished_at,
                duration=ex.total_seconds,
                planned=a.plan.planned_tokens if a.plan else None,
                reported=ex.prompt_tokens,
                completion=ex.completion_tokens,
            )
        tenant = a.new.tenant
        if j.verdict is Verdict.CROSS_TENANT_LEAK and j.crossed and tenant:
            source = j.crossed[0].tenant
            assert source is not None  # only markers of named tenants cross
            metrics.observe_cross_tenant_leak(
                endpoint=endpoint,
                kind=kind,
                source_tenant=source,
                tenant=tenant,
                at=self.finished_at,
            )

    def log_fields(self, *, write_seconds: float, scheduled: datetime | None) -> dict[str, Any]:
        """The ``probe`` log line's fields, in their order."""
        a = self.attempt
        ex, j, new, plan = a.exchange, a.judgement, a.new, a.plan
        return {
            "endpoint": new.endpoint,
            "model": self.model,
            "kind": self.kind.value,
            "probe_id": a.probe_id,
            "verdict": j.verdict.value,
            "reason": j.reason,
            "status": ex.status,
            "planned_prompt_tokens": plan.planned_tokens if plan else None,
            "reported_prompt_tokens": ex.prompt_tokens,
            "marker_found": j.marker_found,
            "foreign_probe_ids": [f.probe_id for f in j.foreign],
            "tenant": new.tenant,
            "foreign_tenants": sorted({f.tenant for f in j.foreign if f.tenant}),
            # Only with several depths, so a single-depth probe line stays as it was.
            **({"depths": {str(d.depth): d.outcome.value for d in j.depths}} if j.depths else {}),
            "ttfb_seconds": _round(ex.ttfb_seconds),
            "duration_seconds": _round(ex.total_seconds),
            "tokenize_calls": plan.tokenize_calls if plan else 0,
            "confirms_probe_id": new.confirms_probe_id,
            "trigger_probe_id": new.trigger_probe_id,
            "store_write_seconds": round(write_seconds, 4),
            "slot": new.slot,
            # To find the engine's spans of this probe (None with trace format off).
            "trace_id": new.trace_id,
            "lag_seconds": (
                None
                if scheduled is None
                else round((new.started_at - scheduled).total_seconds(), 4)
            ),
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
