"""The endpoint page and the API show an endpoint's changes; the page shows its budget."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from kvwatch.metrics import ProbeMetrics
from kvwatch.store.repository import Store
from kvwatch.web.app import create_app
from kvwatch.web.context import WebContext
from kvwatch.web.settings import WebSettings
from tests.web.conftest import NOW

BEFORE = {"model": "glm", "version": "0.11.0", "process_start": "100"}
AFTER = {"model": "glm", "version": "0.12.0", "process_start": "200"}


def _app(
    store: Store, registry: CollectorRegistry, metrics: ProbeMetrics | None = None
) -> TestClient:
    ctx = WebContext(
        store=store,
        registry=registry,
        alive=lambda: True,
        settings=WebSettings(),
        now=lambda: NOW,
        budget=metrics.budget_of if metrics else lambda _name: None,
    )
    return TestClient(create_app(ctx))


def test_a_change_is_listed_by_the_api_with_its_fields_before_and_after(
    store: Store, history: dict[str, int]
) -> None:
    """GET /api/v1/endpoints/alpha/changes returns the change, newest first, with its state."""
    store.observe_fingerprint("alpha", BEFORE, replica="r1", min_gap_seconds=600)
    change = store.observe_fingerprint("alpha", AFTER, replica="r1", min_gap_seconds=600)
    assert change is not None
    with _app(store, CollectorRegistry()) as client:
        body = client.get("/api/v1/endpoints/alpha/changes").json()
        missing = client.get("/api/v1/endpoints/nobody/changes")
    assert missing.status_code == 404
    assert [(c["id"], c["reason"], c["fields"], c["state"]) for c in body] == [
        (change.id, "fingerprint", ["process_start", "version"], "due")
    ]
    assert body[0]["before"] == BEFORE and body[0]["after"] == AFTER


def test_the_endpoint_page_shows_the_change_timeline_and_the_budget(
    store: Store, history: dict[str, int]
) -> None:
    """The page lists each change with what moved, and budget vs planned vs spent."""
    store.observe_fingerprint("alpha", BEFORE, replica="r1", min_gap_seconds=600)
    change = store.observe_fingerprint("alpha", AFTER, replica="r1", min_gap_seconds=600)
    assert change is not None
    registry = CollectorRegistry()
    metrics = ProbeMetrics(registry)
    metrics.register_endpoint(
        "alpha", "glm", "vllm", {"under": 3600.0}, budget=(5_000_000, 4_200_000)
    )
    with _app(store, registry, metrics) as client:
        page = client.get("/endpoints/alpha").text
    assert f'data-change="{change.id}"' in page
    assert "<code>version</code> 0.11.0 → 0.12.0" in page
    assert "token budget 5,000,000 a day · its schedule plans 4,200,000" in page
    assert "spent in the last 24 h" in page
