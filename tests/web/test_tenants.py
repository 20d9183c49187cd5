"""Tenant history: probes carry their tenant in the API, and a cross-tenant leak's page names
both tenants and links the probe the marker came from."""

from __future__ import annotations

from fastapi.testclient import TestClient

from kvwatch.canary.model import ForeignMarker
from tests.helpers.store import Store
from tests.web.conftest import T0, AppFactory, _outcome, _probe

ACME_MARKER = "KVW-ACAC-ACAC-ACAC"


def _leak(store: Store) -> tuple[int, int]:
    source = _probe(store, "shared", "baseline", 0, ACME_MARKER, tenant="acme")
    store.finish_probe(source, _outcome(0, "pass", 1.0))
    victim = _probe(store, "shared", "under", 1, "KVW-GBGB-GBGB-GBGB", tenant="globex")
    leaked = ForeignMarker(ACME_MARKER, source, "shared", T0, tenant="acme")
    store.finish_probe(
        victim,
        _outcome(
            1,
            "cross_tenant_leak",
            1.0,
            marker_found=False,
            reported_prompt_tokens=1,
            foreign_markers=[leaked],
        ),
    )
    return source, victim


def test_the_api_names_each_probes_tenant_and_filters_by_it(
    store: Store, make_app: AppFactory
) -> None:
    """``tenant`` on each probe and on its foreign markers; ?tenant= lists one tenant's."""
    source, victim = _leak(store)
    with TestClient(make_app()) as client:
        body = client.get(f"/api/v1/probes/{victim}").json()
        assert body["tenant"] == "globex"
        assert body["severity"] == "critical"
        assert [(f["probe_id"], f["tenant"]) for f in body["foreign_markers"]] == [(source, "acme")]
        only_acme = client.get("/api/v1/probes?tenant=acme").json()["probes"]
        assert [p["id"] for p in only_acme] == [source]


def test_a_cross_tenant_leak_page_names_both_tenants_and_links_the_source_probe(
    store: Store, make_app: AppFactory
) -> None:
    """The evidence page says who was served whose data, with a link to where it came from."""
    source, victim = _leak(store)
    with TestClient(make_app()) as client:
        page = client.get(f"/probes/{victim}").text
    assert 'id="cross-tenant"' in page
    assert "the answer given to tenant <strong>globex</strong>" in page
    assert f'under tenant <strong>acme</strong> to <a class="leak" href="/probes/{source}">' in page
    assert '<dd id="tenant">globex' in page
    assert "another tenant&#39;s data" in page or "another tenant's data" in page
