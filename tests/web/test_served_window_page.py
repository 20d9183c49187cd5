"""The served window on the endpoint page and in the API, over history the real runner wrote:
the incident's numbers (1,048,576 advertised, a KV pool of 681,280) against the simulator.

The endpoint page is saved under artifacts/screenshots/ (docs/screenshots/served-window.png
is a copy of the SQLite run's, refreshed by hand: a test run must not change tracked files).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from kvwatch.store.repository import Store
from kvwatch.web.app import WebContext, create_app
from tests.conftest import fresh_schema, migrated_store
from tests.helpers.targets import config_for, sim_endpoint_entry, targets_and_runner
from tests.web.test_browser import CHROMIUM, CHROMIUM_ARGS, SHOTS, _browser_or_skip, web

__all__ = ["web"]  # the served-app fixture, shared with the browser test

INCIDENT = SimEndpoint(
    "glm-prod", window=1_048_576, kv_pool=681_280, fault=FaultMode.STALE_KV, flavour="sglang"
)


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def store(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Store]:
    """One freshly migrated store per backend for this module: both tests only read the
    history ``measured`` writes (a 1M-token window search, seconds each), so it is written once
    per backend instead of once per test."""
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'kvwatch.db'}"
        else:
            url = stack.enter_context(
                fresh_schema(request.getfixturevalue("postgres_database_url"))
            )
        yield stack.enter_context(migrated_store(request, url))


async def measure(store: Store) -> int:
    """Baseline, then the capacity check → edge probe → served-window search; returns the
    edge probe's id (the search's trigger)."""
    async with run_simulator([INCIDENT]) as sim, httpx.AsyncClient(timeout=None) as client:
        entry = sim_endpoint_entry(sim, "glm-prod", flavour="sglang")
        config = config_for([entry], database="sqlite:///unused.db")
        targets, runner, _ = targets_and_runner(config, store, client)
        target = targets["glm-prod"]
        assert (await runner.run(target, ProbeKind.BASELINE)).verdict is Verdict.PASS
        chain = await runner.run_checked(target, ProbeKind.CAPACITY)
        assert [r.kind for r in chain][-1] is ProbeKind.BISECT
        edge = [r for r in chain if r.kind is ProbeKind.EDGE][-1]
        assert edge.probe_id is not None
        return edge.probe_id


@pytest.fixture(scope="module")
def measured(store: Store) -> int:
    """The edge probe's id of the history measured once into this module's store."""
    return asyncio.run(measure(store))


def test_the_api_lists_the_served_window_of_an_endpoint(store: Store, measured: int) -> None:
    """/api/v1/endpoints: served_window_tokens and the measurement behind it."""
    app = create_app(WebContext(store=store, registry=CollectorRegistry(), alive=lambda: True))
    with TestClient(app) as client:
        (ep,) = client.get("/api/v1/endpoints").json()
    assert ep["served_window_tokens"] == 681_280
    served = ep["served_window"]
    assert served["advertised_tokens"] == 1_048_576
    assert (served["source"], served["exact"], served["probes"]) == ("search", True, 1)
    assert served["probe_id"] == measured and served["probe_url"] == f"/probes/{measured}"
    assert "bisect" not in ep["latest"]


async def test_the_endpoint_page_shows_advertised_and_served(
    store: Store, measured: int, web: str
) -> None:
    """The endpoint page reads "advertised 1,048,576 · served 681,280" with a link to the
    probe that started the search."""
    _browser_or_skip()
    from playwright.async_api import async_playwright

    backend = store.engine.dialect.name
    SHOTS.mkdir(parents=True, exist_ok=True)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1100, "height": 560})
            await page.goto(f"{web}/endpoints/glm-prod")
            served = page.locator("p.served")
            text = " ".join((await served.inner_text()).split())
            assert text.startswith("advertised 1,048,576 · served 681,280")
            assert await served.locator("a").get_attribute("href") == f"/probes/{measured}"
            await page.screenshot(path=SHOTS / f"served-window-{backend}.png")
        finally:
            await browser.close()
