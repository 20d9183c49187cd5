"""Multi-region history: probes carry their region in the API and on their page."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.helpers.store import Store
from tests.web.conftest import AppFactory, _outcome, _probe


def test_probes_carry_their_region_and_can_be_filtered_by_it(
    store: Store, make_app: AppFactory
) -> None:
    """Each region's probes say where they ran; ?region= lists one region's; none means null."""
    eu = Store(store.engine, region="eu")
    us = Store(store.engine, region="us")
    ids = {
        "eu": _probe(eu, "alpha", "under", 0, "KVW-AAAA-AAAA-AAA1", replica="eu-0"),
        "us": _probe(us, "alpha", "under", 1, "KVW-AAAA-AAAA-AAA2", replica="us-0"),
        None: _probe(store, "alpha", "under", 2, "KVW-AAAA-AAAA-AAA3"),
    }
    us.finish_probe(ids["us"], _outcome(1, "pass", 2.0))
    with TestClient(make_app()) as client:
        listed = client.get("/api/v1/probes").json()["probes"]
        assert [(p["id"], p["region"]) for p in listed] == [
            (ids[None], None),
            (ids["us"], "us"),
            (ids["eu"], "eu"),
        ]
        only_eu = client.get("/api/v1/probes?region=eu").json()["probes"]
        assert [p["id"] for p in only_eu] == [ids["eu"]]
        assert client.get(f"/api/v1/probes/{ids['us']}").json()["region"] == "us"
        assert client.get("/api/v1/probes?region=a%00b").status_code == 422


def test_the_probe_page_shows_the_region_only_when_there_is_one(
    store: Store, make_app: AppFactory
) -> None:
    """A probe run in region eu names it on its page; a regionless probe shows no region row."""
    eu_probe = _probe(Store(store.engine, region="eu"), "alpha", "under", 0, "KVW-AAAA-AAAA-AAA1")
    plain = _probe(store, "alpha", "over", 1, "KVW-AAAA-AAAA-AAA2")
    with TestClient(make_app()) as client:
        assert "<dt>region</dt><dd>eu</dd>" in client.get(f"/probes/{eu_probe}").text
        assert "<dt>region</dt>" not in client.get(f"/probes/{plain}").text
