"""Beside a daemon, the overview and the endpoint list show the endpoints it probes now."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from kvwatch.store.repository import Store
from kvwatch.web.app import create_app
from kvwatch.web.context import WebContext
from kvwatch.web.settings import WebSettings
from tests.web.conftest import NOW


def _client(store: Store, probed: set[str]) -> TestClient:
    ctx = WebContext(
        store=store,
        registry=CollectorRegistry(),
        alive=lambda: True,
        settings=WebSettings(),
        now=lambda: NOW,
        probed=lambda: probed,
    )
    return TestClient(create_app(ctx))


def test_an_endpoint_no_longer_probed_leaves_the_overview_but_keeps_its_history(
    store: Store, history: dict[str, int]
) -> None:
    """Only alpha is probed: beta is gone from / and /api/v1/endpoints, and its page and
    probes are still there by name."""
    probed = {"alpha", "beta"}
    with _client(store, probed) as client:
        assert [e["name"] for e in client.get("/api/v1/endpoints").json()] == ["alpha", "beta"]
        probed.discard("beta")  # a reload removed it

        assert [e["name"] for e in client.get("/api/v1/endpoints").json()] == ["alpha"]
        page = client.get("/")
        assert page.status_code == 200
        assert "/endpoints/alpha" in page.text and "/endpoints/beta" not in page.text
        assert client.get("/endpoints/beta").status_code == 200
        beta = client.get("/api/v1/probes", params={"endpoint": "beta"}).json()["probes"]
        assert history["b-under"] in {p["id"] for p in beta}
