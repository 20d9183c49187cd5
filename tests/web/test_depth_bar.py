"""The probe page draws the prompt as a bar: each marker at its depth in its outcome's
colour, the lost part shaded, all of it said in text too (headless Chromium).

The bar is saved as artifacts/screenshots/marker-depths-<database>.png.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from kvwatch.store.repository import Store
from tests.helpers.targets import config_for, sim_endpoint_entry, targets_and_runner
from tests.web import test_browser as browser_rig

web = browser_rig.web  # the uvicorn-served app of the browser tests, shared here
DEPTHS = [0.0, 0.25, 0.75, 1.0]
GREEN, RED = browser_rig.GREEN, browser_rig.RED
# A pool of 60 % of the window: a head cut loses the markers at 0.0 and 0.25.
HEAD_CUT = SimEndpoint("head-cut", window=8192, kv_pool=4915, fault=FaultMode.TRUNCATE_HEAD)


@pytest.fixture
async def cut_probe(store: Store) -> AsyncIterator[int]:
    """One under probe with four depths against a head-truncating simulated engine."""
    async with run_simulator([HEAD_CUT]) as sim, httpx.AsyncClient(timeout=None) as client:
        defaults = {"confirm": False, "max_tokens": 64, "marker_depths": DEPTHS}
        config = config_for(
            [sim_endpoint_entry(sim, HEAD_CUT.name)],
            database="sqlite:///unused.db",
            defaults=defaults,
        )
        targets, runner, _metrics = targets_and_runner(config, store, client)
        report = await runner.run(targets[HEAD_CUT.name], ProbeKind.UNDER)
        assert report.verdict is Verdict.TRUNCATED, report.reason
        assert report.probe_id is not None
        yield report.probe_id


async def test_the_probe_page_colours_each_marker_by_outcome_and_shades_the_lost_head(
    store: Store, cut_probe: int, web: str
) -> None:
    """Missing ticks red, found green, in depth order; the lost head is shaded; titles and
    the table say the same in words."""
    browser_rig._browser_or_skip()
    from playwright.async_api import async_playwright

    browser_rig.SHOTS.mkdir(parents=True, exist_ok=True)
    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(
            executable_path=browser_rig.CHROMIUM, args=browser_rig.CHROMIUM_ARGS
        )
        try:
            page = await chromium.new_page(viewport={"width": 1100, "height": 800})
            await page.goto(f"{web}/probes/{cut_probe}")
            bar = page.locator("svg.depth-bar")
            label = str(await bar.get_attribute("aria-label"))
            assert label.startswith(
                "head lost (markers at 0.0, 0.25 missing; 0.75, 1.0 found): "
                "the engine kept the last ~4,9"
            ), label
            ticks = page.locator("svg.depth-bar g.tick")
            assert await ticks.count() == 4
            seen = []
            for i in range(4):
                tick = ticks.nth(i)
                fill = await tick.locator("rect").evaluate("el => getComputedStyle(el).fill")
                seen.append(
                    (
                        await tick.get_attribute("data-depth"),
                        await tick.get_attribute("data-outcome"),
                        fill,
                    )
                )
            assert seen == [
                ("0.0", "missing", RED),
                ("0.25", "missing", RED),
                ("0.75", "found", GREEN),
                ("1.0", "found", GREEN),
            ]
            title = await ticks.nth(0).locator("title").text_content()
            assert title is not None and title.endswith("at depth 0.0: missing")
            lost = page.locator("svg.depth-bar rect.lost")
            box = await lost.bounding_box()
            whole = await page.locator("svg.depth-bar rect.prompt").bounding_box()
            assert box is not None and whole is not None
            assert box["x"] == pytest.approx(whole["x"], abs=1)  # starts at the prompt's start
            assert 0.3 < box["width"] / whole["width"] < 0.5  # about the 40 % that was cut
            rows = page.locator("table.depths tbody tr")
            assert [await rows.nth(i).get_attribute("data-outcome") for i in range(4)] == [
                "missing",
                "missing",
                "found",
                "found",
            ]
            backend = store.engine.dialect.name
            await page.locator("figure.depth-bar").screenshot(
                path=browser_rig.SHOTS / f"marker-depths-{backend}.png"
            )
        finally:
            await chromium.close()
