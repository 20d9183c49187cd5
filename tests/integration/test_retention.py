"""Retention deletes old results and keeps critical evidence longer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kvwatch.config.model import Retention
from kvwatch.retention import prune_once
from kvwatch.store.records import NewProbe, ProbeOutcome
from tests.helpers.store import get_probe

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def add(store, endpoint_id: int, age_days: float, verdict: str) -> int:
    started = NOW - timedelta(days=age_days)
    pid = store.begin_probe(
        NewProbe(
            endpoint="ep",
            endpoint_id=endpoint_id,
            kind="under",
            started_at=started,
            replica="r",
            model="m",
            planned_prompt_tokens=10,
            target_prompt_tokens=10,
            max_tokens=4,
            token_source="server",
            tokenize_calls=1,
            marker=f"KVW-0000-0000-{int(age_days * 10):04d}"[:18],
            marker_depth=0.0,
            streamed=True,
        )
    )
    store.finish_probe(pid, ProbeOutcome(verdict=verdict, reason="", finished_at=started))
    return pid


def test_old_results_go_and_critical_ones_stay_longer(store):
    """Past `probes` only critical verdicts remain; past `critical` nothing does."""
    eid = store.upsert_endpoint("ep", "http://h/v1", "openai", "m", 4096, None, {})
    recent = add(store, eid, 0.5, "pass")
    old_pass = add(store, eid, 5, "pass")
    old_leak = add(store, eid, 6, "foreign_marker")
    ancient_leak = add(store, eid, 20, "foreign_marker")
    deleted = prune_once(store, Retention(probes=86400, critical=10 * 86400), now=NOW)
    assert deleted == 2
    assert get_probe(store, recent) is not None
    assert get_probe(store, old_leak) is not None
    assert get_probe(store, old_pass) is None
    assert get_probe(store, ancient_leak) is None
