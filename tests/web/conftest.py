"""A small frozen history (two endpoints, a leak, a confirmation, alerts) and app clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from kvwatch.canary.model import ForeignMarker
from kvwatch.store import AlertStateRecord, NewProbe, ProbeOutcome
from kvwatch.web.app import WebContext, create_app
from kvwatch.web.settings import WebSettings
from tests.helpers.store import Store

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=1)
LEAKED = "KVW-B0B0-B0B0-B0B0"
# The trace the leaking probe's requests carried (its confirmation predates tracing: none).
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"

AppFactory = Callable[..., FastAPI]


def _probe(store: Store, endpoint: str, kind: str, minute: int, marker: str, **kw: object) -> int:
    endpoint_id = store.upsert_endpoint(
        endpoint, f"http://10.0.0.1:8000/{endpoint}/v1", "vllm", "glm-5.3", 8192, 6144, {}
    )
    planned = {"under": 8176, "over": 8177, "baseline": 1536}[kind]
    new = NewProbe(
        endpoint=endpoint,
        endpoint_id=endpoint_id,
        kind=kind,
        started_at=T0 + timedelta(minutes=minute),
        replica="kvwatch-0",
        model="glm-5.3",
        planned_prompt_tokens=planned,
        target_prompt_tokens=planned,
        max_tokens=16,
        token_source="server",
        tokenize_calls=1,
        marker=marker,
        marker_depth=0.0,
        streamed=True,
    )
    return store.begin_probe(replace(new, **kw))  # type: ignore[arg-type]


def _outcome(minute: int, verdict: str, seconds: float, **kw: object) -> ProbeOutcome:
    base = ProbeOutcome(
        verdict=verdict,
        reason=f"{verdict} (test)",
        finished_at=T0 + timedelta(minutes=minute, seconds=seconds),
        reported_prompt_tokens=8176,
        completion_tokens=9,
        marker_found=True,
        http_status=200,
        finish_reason="stop",
        answer_excerpt="The code is KVW-...",
        ttfb_seconds=seconds / 2,
        duration_seconds=seconds,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


@pytest.fixture
def history(store: Store) -> dict[str, int]:
    """Probes of a healthy endpoint (alpha) and a leaking one (beta), plus alert states."""
    ids: dict[str, int] = {}
    ids["a-under"] = _probe(store, "alpha", "under", 0, "KVW-AAAA-AAAA-AAA1")
    store.finish_probe(ids["a-under"], _outcome(0, "pass", 2.0))
    ids["a-over"] = _probe(store, "alpha", "over", 1, "KVW-AAAA-AAAA-AAA2")
    store.finish_probe(
        ids["a-over"],
        _outcome(
            1,
            "pass",
            0.5,
            reported_prompt_tokens=None,
            completion_tokens=None,
            marker_found=None,
            http_status=400,
            finish_reason=None,
            answer_excerpt=None,
            error_body='{"error": "context length exceeded"}',
        ),
    )
    ids["b-base"] = _probe(store, "beta", "baseline", 3, LEAKED)
    store.finish_probe(
        ids["b-base"], _outcome(3, "pass", 1.0, reported_prompt_tokens=1536, completion_tokens=8)
    )
    leak = ForeignMarker(
        marker=LEAKED, probe_id=ids["b-base"], endpoint="beta", issued_at=T0 + timedelta(minutes=3)
    )
    ids["b-under"] = _probe(store, "beta", "under", 4, "KVW-CCCC-CCCC-CCC1", trace_id=TRACE_ID)
    store.finish_probe(
        ids["b-under"],
        _outcome(
            4,
            "foreign_marker",
            3.0,
            marker_found=False,
            foreign_markers=(leak,),
            answer_excerpt=f"The code is {LEAKED}. Also: Alice's card 4111-1111",
        ),
    )
    ids["b-confirm"] = _probe(
        store, "beta", "under", 5, "KVW-CCCC-CCCC-CCC2", confirms_probe_id=ids["b-under"]
    )
    store.finish_probe(
        ids["b-confirm"],
        _outcome(5, "foreign_marker", 4.0, marker_found=False, foreign_markers=(leak,)),
    )
    ids["b-running"] = _probe(store, "beta", "under", 6, "KVW-CCCC-CCCC-CCC3")
    store.save_alert_states(
        [
            AlertStateRecord(
                alertname="KVWatchCrossRequestLeak",
                endpoint="beta",
                probe="under",
                state="firing",
                severity="critical",
                updated_at=T0 + timedelta(minutes=5),
                failures=2,
                starts_at=T0 + timedelta(minutes=5),
                last_probe_id=ids["b-confirm"],
                labels={"alertname": "KVWatchCrossRequestLeak", "endpoint": "beta"},
                annotations={"summary": "beta leaked another request's marker"},
                generator_url=f"http://kvwatch.example/probes/{ids['b-confirm']}",
            ),
            AlertStateRecord(
                alertname="KVWatchProbeFailing",
                endpoint="alpha",
                probe="under",
                state="resolved",
                severity="warning",
                updated_at=T0 + timedelta(minutes=30),
                starts_at=T0 - timedelta(hours=2),
                ends_at=T0 + timedelta(minutes=30),
            ),
            AlertStateRecord(
                alertname="KVWatchProbeFailing",
                endpoint="alpha",
                probe="over",
                state="resolved",
                severity="warning",
                updated_at=T0 - timedelta(days=3),
                ends_at=T0 - timedelta(days=3),
            ),
        ]
    )
    return ids


@pytest.fixture
def make_app(store: Store) -> AppFactory:
    """Build the web app over the test store, clock frozen at NOW; settings may be given."""

    def build(settings: WebSettings | None = None, alive: bool = True) -> FastAPI:
        ctx = WebContext(
            store=store,
            registry=CollectorRegistry(),
            alive=lambda: alive,
            settings=settings or WebSettings(),
            now=lambda: NOW,
        )
        return create_app(ctx)

    return build


@pytest.fixture
def client(make_app: AppFactory) -> Iterator[TestClient]:
    """A client of the app with default (open) settings."""
    with TestClient(make_app()) as c:
        yield c
