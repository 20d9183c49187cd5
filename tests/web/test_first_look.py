"""What a newcomer sees first: reasons whose times read like the rest of the page.

The pages are checked as HTML and in headless Chromium.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from fastapi.testclient import TestClient

from kvwatch.canary.markers import new_marker
from kvwatch.store import NewProbe, ProbeOutcome, Store
from tests.web.conftest import NOW
from tests.web.test_browser import CHROMIUM, CHROMIUM_ARGS, _browser_or_skip, web

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
