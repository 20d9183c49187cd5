"""The review pages in headless Chromium, over history the real runner wrote against the
simulator: faulty endpoints are red, healthy ones green, and clicks reach a leak's evidence.

Each page is saved as a screenshot under artifacts/screenshots/.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.simulator.fleet import demo_fleet
from kvwatch.simulator.server import run_simulator
from kvwatch.store import NewProbe, ProbeOutcome
from kvwatch.web.app import WebContext, create_app
from kvwatch.web.server import embedded_server
from tests.helpers.store import Store, get_probe
from tests.helpers.targets import config_for, sim_endpoint_entry, targets_and_runner

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
FLEET = ("healthy", "stale-kv", "accept-over-limit", "no-recall", "throttled", "server-error")
GREEN, RED = "rgb(26, 152, 80)", "rgb(215, 48, 39)"


def _browser_or_skip() -> None:
    missing = None
    if shutil.which(CHROMIUM) is None:
        missing = f"{CHROMIUM} is not installed"
    else:
        try:
            import playwright.async_api  # noqa: F401
        except ImportError:
            missing = "playwright is not installed"
    if missing is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{missing} (CI is set, so the browser tests must run)")
        pytest.skip(missing)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
async def probed(store: Store) -> AsyncIterator[dict[str, dict[ProbeKind, int]]]:
    """Probe each simulator endpoint once per kind (baseline first) through the real runner."""
    fleet = [ep for ep in demo_fleet() if ep.name in FLEET]
    async with run_simulator(fleet) as sim, httpx.AsyncClient(timeout=None) as client:
        entries = [sim_endpoint_entry(sim, ep.name) for ep in fleet]
        config = config_for(entries, database="sqlite:///unused.db", defaults={"confirm": False})
        targets, runner, _metrics = targets_and_runner(config, store, client)
        ids: dict[str, dict[ProbeKind, int]] = {}
        for name, target in targets.items():
            # Baseline first, so a stale KV cache has an earlier marker to leak into "under".
            for kind in (ProbeKind.BASELINE, ProbeKind.UNDER, ProbeKind.OVER):
                report = await runner.run(target, kind)
                ids.setdefault(name, {})[kind] = report.probe_id
        yield ids


@pytest.fixture
async def web(store: Store) -> AsyncIterator[str]:
    """The web app served by uvicorn on a free loopback port; yields its base URL."""
    app = create_app(WebContext(store=store, registry=CollectorRegistry(), alive=lambda: True))
    port = _free_port()
    server = embedded_server(app, "127.0.0.1", port)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def test_an_operator_clicks_from_the_overview_to_a_leaks_evidence(
    store: Store, probed: dict[str, dict[ProbeKind, int]], web: str
) -> None:
    """Overview colours faulty endpoints red and healthy green; endpoint → probe → leak source."""
    _browser_or_skip()
    from playwright.async_api import async_playwright

    leak = get_probe(store, probed["stale-kv"][ProbeKind.UNDER])
    assert leak is not None and leak.verdict == Verdict.FOREIGN_MARKER
    source = probed["stale-kv"][ProbeKind.BASELINE]
    SHOTS.mkdir(parents=True, exist_ok=True)
    backend = store.engine.dialect.name

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            await page.goto(f"{web}/")

            async def status_colour(name: str) -> str:
                dot = page.locator(f'tr.endpoint[data-endpoint="{name}"] .dot')
                return str(await dot.evaluate("el => getComputedStyle(el).backgroundColor"))

            assert await status_colour("healthy") == GREEN
            for faulty in ("stale-kv", "accept-over-limit"):
                assert await status_colour(faulty) == RED, faulty
            assert await page.locator("tr.endpoint").count() == len(FLEET)
            await page.screenshot(path=SHOTS / f"overview-{backend}.png", full_page=True)

            # By its accessible name: :text-is does not match across the <wbr> in a name.
            await page.get_by_role("link", name="stale-kv", exact=True).click()
            await page.wait_for_url(f"{web}/endpoints/stale-kv")
            assert await page.locator("svg.chart").count() == 2
            assert await page.locator('svg.chart rect.cell[data-tone="critical"]').count() >= 1
            await page.screenshot(path=SHOTS / f"endpoint-{backend}.png", full_page=True)

            await page.click(f'table.probes a[href="/probes/{leak.id}"]')
            await page.wait_for_url(f"{web}/probes/{leak.id}")
            assert await page.locator("h1 .badge").inner_text() == "foreign_marker"
            assert leak.marker in await page.locator("dl.evidence").inner_text()
            assert await page.locator("#marker-found").inner_text() == "missing from the answer"
            link = page.locator("a.leak")
            assert await link.get_attribute("href") == f"/probes/{source}"
            await page.screenshot(path=SHOTS / f"probe-{backend}.png", full_page=True)

            await link.click()
            await page.wait_for_url(f"{web}/probes/{source}")
            assert await page.locator("h1 .badge").inner_text() == "pass"
            await page.screenshot(path=SHOTS / f"leak-source-{backend}.png", full_page=True)

            await page.goto(f"{web}/probes?verdict=over_accepted")
            assert await page.locator("table.probes tbody tr.row").count() == 1
            await page.screenshot(path=SHOTS / f"probes-{backend}.png", full_page=True)

            await page.goto(f"{web}/alerts")
            await page.screenshot(path=SHOTS / f"alerts-{backend}.png", full_page=True)
        finally:
            await browser.close()


# Endpoints whose probe lists differ: the default set, baseline only, the capacity check with
# its edge probe, and one registered that has not finished a probe yet.
MIXED_FLEET: dict[str, tuple[tuple[ProbeKind, Verdict], ...]] = {
    "alpha": (
        (ProbeKind.UNDER, Verdict.PASS),
        (ProbeKind.OVER, Verdict.PASS),
        (ProbeKind.BASELINE, Verdict.PASS),
        (ProbeKind.CAPACITY, Verdict.PASS),
    ),
    "beta": ((ProbeKind.BASELINE, Verdict.CANARY_INEFFECTIVE),),
    "gamma": ((ProbeKind.CAPACITY, Verdict.CAPACITY_MISMATCH), (ProbeKind.EDGE, Verdict.PASS)),
    "delta": (),
}


def _record_mixed_fleet(store: Store) -> dict[int, ProbeKind]:
    started = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    kinds: dict[int, ProbeKind] = {}
    for name, probes in MIXED_FLEET.items():
        endpoint_id = store.upsert_endpoint(
            name, f"http://10.0.0.1:8000/{name}/v1", "vllm", "glm-5.3", 8192, 6144, {}
        )
        for minute, (kind, verdict) in enumerate(probes):
            probe_id = store.begin_probe(
                NewProbe(
                    endpoint=name,
                    endpoint_id=endpoint_id,
                    kind=kind.value,
                    started_at=started + timedelta(minutes=minute),
                    replica="kvwatch-0",
                    model="glm-5.3",
                    planned_prompt_tokens=1536,
                    target_prompt_tokens=1536,
                    max_tokens=16,
                    token_source="server",
                    tokenize_calls=1,
                    marker=f"KVW-{name[0].upper()}000-0000-000{minute}",
                    marker_depth=0.0,
                    streamed=True,
                )
            )
            store.finish_probe(
                probe_id,
                ProbeOutcome(
                    verdict=verdict.value,
                    reason=f"{verdict.value} (test)",
                    finished_at=started + timedelta(minutes=minute, seconds=1),
                    http_status=200,
                    duration_seconds=1.0,
                ),
            )
            kinds[probe_id] = kind
    return kinds


async def test_every_overview_row_has_a_cell_under_each_heading(store: Store, web: str) -> None:
    """With endpoints running different probe kinds, each row has as many cells as the header
    and each latest-verdict badge sits under the heading of its own kind."""
    _browser_or_skip()
    from playwright.async_api import async_playwright

    kinds = _record_mixed_fleet(store)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            await page.goto(f"{web}/")
            table = await page.locator("table.overview").evaluate(
                """t => ({
                    headings: [...t.tHead.rows[0].cells].map(c => c.textContent.trim()),
                    rows: [...t.tBodies[0].rows].map(r => ({
                        cells: r.cells.length,
                        badges: [...r.cells].flatMap((c, i) =>
                            [...c.querySelectorAll("a[href^='/probes/'] .badge")].map(b => [
                                Number(b.closest("a").getAttribute("href").split("/").pop()),
                                i,
                            ])),
                    })),
                })"""
            )
        finally:
            await browser.close()

    headings = table["headings"]
    assert headings[3:-1] == ["under", "over", "baseline", "capacity", "edge"]
    assert [row["cells"] for row in table["rows"]] == [len(headings)] * len(MIXED_FLEET)
    placed = {
        probe_id: headings[column] for row in table["rows"] for probe_id, column in row["badges"]
    }
    assert placed == {probe_id: kind.value for probe_id, kind in kinds.items()}
