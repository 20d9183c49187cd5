"""Factories for store tests: realistic probe inputs with fresh markers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Connection, MetaData, insert

from kvwatch.canary.markers import new_marker
from kvwatch.store import NewProbe, ProbeOutcome, Store

T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)

NewProbeFactory = Callable[..., NewProbe]


@pytest.fixture
def new_probe(store: Store) -> NewProbeFactory:
    """Build a NewProbe for a registered endpoint; keyword arguments override fields."""
    endpoint_ids: dict[str, int] = {}

    def build(**overrides: Any) -> NewProbe:
        endpoint = overrides.get("endpoint", "glm-prod")
        if endpoint not in endpoint_ids:
            endpoint_ids[endpoint] = store.upsert_endpoint(
                endpoint,
                f"http://127.0.0.1:8000/{endpoint}/v1",
                "openai",
                "glm-5.3",
                131072,
                262144,
                {"team": "inference"},
            )
        base = NewProbe(
            endpoint=endpoint,
            endpoint_id=endpoint_ids[endpoint],
            kind="under",
            started_at=T0,
            replica="kvwatch-0",
            model="glm-5.3",
            planned_prompt_tokens=131056,
            target_prompt_tokens=131056,
            max_tokens=16,
            token_source="server",
            tokenize_calls=1,
            marker=new_marker(),
            marker_depth=0.0,
            streamed=True,
        )
        return replace(base, **overrides)

    return build


def outcome(verdict: str = "pass", **overrides: Any) -> ProbeOutcome:
    """A finished probe's evidence, passing unless told otherwise."""
    base = ProbeOutcome(
        verdict=verdict,
        reason="marker recalled",
        finished_at=T0 + timedelta(seconds=42),
        reported_prompt_tokens=131056,
        completion_tokens=9,
        marker_found=True,
        http_status=200,
        finish_reason="stop",
        answer_excerpt="The code is KVW-...",
        ttfb_seconds=40.5,
        duration_seconds=41.25,
    )
    return replace(base, **overrides)


@pytest.fixture
def t0() -> datetime:
    """The default started_at of factory-built probes."""
    return T0


@pytest.fixture
def make_outcome() -> Callable[..., ProbeOutcome]:
    """The `outcome` builder, as a fixture so test modules need no imports from here."""
    return outcome


def insert_old_rows(
    connection: Connection, tables: MetaData, *probes: dict[str, Any], at: datetime = T0
) -> None:
    """Write endpoint "ep" (id 1) and probes of it, started ``at``, straight into an older
    schema as a migration test's history; each dict overrides columns every schema has."""
    connection.execute(
        insert(tables.tables["endpoints"]).values(
            id=1,
            name="ep",
            url="http://h/v1",
            flavour="openai",
            model="m",
            labels={},
            created_at=at,
            updated_at=at,
        )
    )
    for probe in probes:
        row = {
            "endpoint": "ep",
            "endpoint_id": 1,
            "kind": "under",
            "state": "done",
            "verdict": "pass",
            "started_at": at,
            "replica": "kvwatch-0",
            "model": "m",
            "planned_prompt_tokens": 1,
            "target_prompt_tokens": 1,
            "max_tokens": 1,
            "token_source": "server",
            "tokenize_calls": 1,
            "marker": "KVW-AAAA-BBBB-CCCC",
            "marker_depth": 0.0,
            "foreign_markers": [],
            "streamed": True,
        }
        connection.execute(insert(tables.tables["probes"]).values(**(row | probe)))
