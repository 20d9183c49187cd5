"""What a newcomer sees first: reasons whose times read like the rest of the page, an overview
that fits a laptop screen, and a new endpoint's chart drawn across its width.

The pages are checked as HTML and in headless Chromium; the browser's overview is saved under
artifacts/screenshots/.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient

from kvwatch.canary.markers import new_marker
from kvwatch.store import NewProbe, ProbeOutcome, Store
from kvwatch.web import svg
from kvwatch.web.pages import STRIP
from tests.web.conftest import NOW
from tests.web.test_browser import CHROMIUM, CHROMIUM_ARGS, SHOTS, _browser_or_skip, web

__all__ = ["web"]  # the served-app fixture, shared with the browser test


def _record(
    store: Store,
    endpoint: str,
    started: datetime,
    *,
    kind: str = "under",
    verdict: str = "pass",
    reason: str | None = None,
    duration: float = 1.0,
) -> int:
    endpoint_id = store.upsert_endpoint(
        endpoint, f"http://10.0.0.1:8000/{endpoint}/v1", "vllm", "glm-5.3", 8192, 6144, {}
    )
    probe_id = store.begin_probe(
        NewProbe(
            endpoint=endpoint,
            endpoint_id=endpoint_id,
            kind=kind,
            started_at=started,
            replica="kvwatch-0",
            model="glm-5.3",
            planned_prompt_tokens=8176,
            target_prompt_tokens=8176,
            max_tokens=16,
            token_source="server",
            tokenize_calls=1,
            marker=new_marker(),
            marker_depth=0.0,
            streamed=True,
        )
    )
    store.finish_probe(
        probe_id,
        ProbeOutcome(
            verdict=verdict,
            reason=reason or f"{verdict} (test)",
            finished_at=started + timedelta(seconds=duration),
            reported_prompt_tokens=8176,
            http_status=200,
            duration_seconds=duration,
        ),
    )
    return probe_id


def _text(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


# -- times in reasons -------------------------------------------------------------------------

ISSUED = datetime(2026, 3, 1, 12, 3, 0, 126489, tzinfo=UTC)
RAW_REASON = f"answer holds marker of probe 1 (beta, issued {ISSUED.isoformat()})"
SHOWN_REASON = "answer holds marker of probe 1 (beta, issued 2026-03-01 12:03:00 UTC)"


def test_times_in_a_reason_are_written_as_the_page_writes_times() -> None:
    """Offsets become UTC to the second; a time without an offset and the rest stay as they
    are, escaped."""
    from kvwatch.web.pages import _readable_times

    assert _text(_readable_times(RAW_REASON)) == SHOWN_REASON
    shown = _readable_times("<b> issued 2026-03-01T14:03:00.5+02:00, 2026-03-01T12:00:00Z")
    assert _text(shown) == "&lt;b&gt; issued 2026-03-01 12:03:00 UTC, 2026-03-01 12:00:00 UTC"
    assert _readable_times("at 2026-03-01T12:00:00.25 local") == "at 2026-03-01T12:00:00.25 local"
    assert _readable_times(None) == ""


def test_a_reasons_time_reads_like_the_page_and_the_api_keeps_it_exact(
    client: TestClient, store: Store
) -> None:
    """Probe page, probe list and endpoint page show the reason's time to the second in UTC;
    /api/v1 still returns the stored reason."""
    probe_id = _record(store, "beta", NOW - timedelta(minutes=5), reason=RAW_REASON)
    for path in (f"/probes/{probe_id}", "/probes", "/endpoints/beta"):
        html = client.get(path).text
        assert SHOWN_REASON in _text(html), path
        assert ".126489" not in _text(html), path
    assert client.get(f"/api/v1/probes/{probe_id}").json()["reason"] == RAW_REASON


async def test_a_reasons_time_reads_like_the_page_in_the_browser(store: Store, web: str) -> None:
    """In Chromium the probe page's reason line shows the time as its other times are."""
    _browser_or_skip()
    from playwright.async_api import async_playwright

    probe_id = _record(store, "beta", NOW, reason=RAW_REASON)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page()
            await page.goto(f"{web}/probes/{probe_id}")
            reason = await page.locator("p.reason-line").inner_text()
            started = await page.locator("dd time").first.inner_text()
        finally:
            await browser.close()

    assert reason == SHOWN_REASON
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", started)


# -- the overview at 1280 px ------------------------------------------------------------------

SEPARATORS = "-._"
# Names as long as fleets name them: region, purpose, model build, stage.
LONG_NAMES = (
    "glm-prod-eu-west-1-long-context-canary",
    "qwen3-coder-480b-a35b-instruct.fp8_staging.eu-west-1",
    "alpha",
)
# Each kind's latest verdict, among the longest there are: the widest overview row.
LONG_VERDICTS = {
    "under": "canary_ineffective",
    "over": "wrong_rejection",
    "baseline": "cross_tenant_leak",
    "capacity": "capacity_mismatch",
    "edge": "foreign_marker",
}


def _crowd(store: Store, now: datetime) -> None:
    """Long names, five kinds with long latest verdicts, and far more probes than a strip."""
    kinds = list(LONG_VERDICTS)
    for name in LONG_NAMES:
        for n in range(3 * STRIP):
            kind = kinds[n % len(kinds)]
            started = now - timedelta(minutes=30) + timedelta(seconds=20 * n)
            _record(store, name, started, kind=kind, verdict=LONG_VERDICTS[kind])


# For each element: the characters that end a rendered line (all but the last line).
LINE_ENDS = """els => els.map(el => {
    const chars = [];
    const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    for (let node = walk.nextNode(); node; node = walk.nextNode()) {
        for (let i = 0; i < node.length; i++) {
            const range = document.createRange();
            range.setStart(node, i);
            range.setEnd(node, i + 1);
            chars.push([node.data[i], range.getBoundingClientRect().top]);
        }
    }
    return chars.filter((c, i) => i + 1 < chars.length && chars[i + 1][1] > c[1] + 1)
        .map(c => c[0]);
})"""


async def test_the_overview_fits_a_1280_pixel_screen_with_long_names_and_many_probes(
    store: Store, web: str
) -> None:
    """At 1280×800 the page does not scroll sideways, strips stay in their cells, and names
    wrap only after a separator."""
    _browser_or_skip()
    from playwright.async_api import async_playwright

    _crowd(store, datetime.now(UTC))
    SHOTS.mkdir(parents=True, exist_ok=True)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            await page.goto(f"{web}/")
            widths = await page.evaluate(
                "[document.documentElement.scrollWidth, window.innerWidth]"
            )
            strips = await page.locator("div.strip").evaluate_all(
                """strips => strips.map(s => {
                    const strip = s.getBoundingClientRect();
                    const cell = s.closest("td").getBoundingClientRect();
                    return {cells: s.children.length,
                            inside: strip.left >= cell.left && strip.right <= cell.right};
                })"""
            )
            line_ends = await page.locator("a.name").evaluate_all(LINE_ENDS)
            await page.screenshot(
                path=SHOTS / f"overview-1280-{store.engine.dialect.name}.png", full_page=True
            )
        finally:
            await browser.close()

    assert widths[0] <= widths[1], f"the page is {widths[0]} px wide in a {widths[1]} px window"
    assert strips == [{"cells": STRIP, "inside": True}] * len(LONG_NAMES)
    assert any(line_ends), "no name wrapped, so none was tested"
    for ends in line_ends:
        assert all(c in SEPARATORS for c in ends), line_ends


# -- a new endpoint's chart -------------------------------------------------------------------


def _minutes_of_history(store: Store, endpoint: str, until: datetime, minutes: int) -> None:
    """A probe a minute over the ``minutes`` before ``until``, durations varying."""
    for m in range(minutes, 0, -1):
        _record(store, endpoint, until - timedelta(minutes=m), duration=1.0 + m % 4)


def _bar_xs(html: str) -> list[float]:
    return [float(x) for x in re.findall(r'<rect class="bar [^"]*" x="([\d.]+)"', html)]


def _chart_start(html: str) -> str:
    """The time label under the left end of the first chart."""
    found = re.search(rf'<text class="label" x="{svg.LEFT}" y="\d+">([^<]+)</text>', html)
    assert found is not None
    return found[1]


def test_a_short_history_is_charted_across_the_whole_width(
    client: TestClient, store: Store
) -> None:
    """Ten minutes of probes on the default 24 h page start at the left edge and reach the
    right, one bar a minute."""
    _minutes_of_history(store, "fresh", NOW, 10)
    html = client.get("/endpoints/fresh").text
    xs = _bar_xs(html)
    plot = svg.RIGHT - svg.LEFT
    assert len(set(xs)) == 10
    assert min(xs) < svg.LEFT + 0.05 * plot
    assert max(xs) > svg.RIGHT - 0.15 * plot
    assert _chart_start(html) == "2026-03-01 12:50 UTC"
    assert "its history starts 2026-03-01 12:50:00 UTC" in _text(html)


def test_an_explicit_range_still_bounds_a_longer_history(client: TestClient, store: Store) -> None:
    """Three hours of probes at ?range=1h: the chart covers the last hour only."""
    _minutes_of_history(store, "older", NOW, 180)
    html = client.get("/endpoints/older?range=1h").text
    assert _chart_start(html) == "2026-03-01 12:00 UTC"
    assert len(set(_bar_xs(html))) == 60
    assert "its history starts" not in html


def test_a_probe_seconds_old_is_charted_over_the_last_five_minutes(
    client: TestClient, store: Store
) -> None:
    """A first probe 20 s ago is not stretched over the whole chart: it spans 5 minutes."""
    _record(store, "newborn", NOW - timedelta(seconds=20))
    html = client.get("/endpoints/newborn").text
    assert _chart_start(html) == "2026-03-01 12:55 UTC"
    (x,) = _bar_xs(html)
    assert svg.RIGHT - 0.1 * (svg.RIGHT - svg.LEFT) < x < svg.RIGHT


async def test_a_new_endpoints_bars_spread_across_its_chart_in_the_browser(
    store: Store, web: str
) -> None:
    """In Chromium, ten minutes of history draw bars from the chart's left part to its right."""
    _browser_or_skip()
    from playwright.async_api import async_playwright

    _minutes_of_history(store, "fresh", datetime.now(UTC), 10)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1280, "height": 800})
            await page.goto(f"{web}/endpoints/fresh")
            chart: dict[str, Any] = await page.locator("svg.chart").first.evaluate(
                """svg => ({
                    box: svg.getBoundingClientRect().toJSON(),
                    bars: [...svg.querySelectorAll("rect.bar")].map(
                        b => b.getBoundingClientRect().left),
                })"""
            )
        finally:
            await browser.close()

    box, bars = chart["box"], chart["bars"]
    assert len({round(x) for x in bars}) == 10
    assert min(bars) < box["left"] + 0.2 * box["width"]
    assert max(bars) > box["left"] + 0.8 * box["width"]
