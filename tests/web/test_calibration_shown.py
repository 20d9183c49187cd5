"""An endpoint whose tokens kvwatch estimates shows what the engine's counts taught it."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi.testclient import TestClient

from kvwatch.store.records import CalibrationRecord
from kvwatch.store.repository import Store

AT = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)


def test_the_api_and_the_endpoint_page_show_the_stored_calibration(
    client: TestClient, history: dict[str, int], store: Store
) -> None:
    """/api/v1/endpoints lists each size class; the endpoint page says the tokens are
    estimated and how well; an endpoint with an exact tokenizer shows none."""
    store.save_calibrations(
        [
            CalibrationRecord(
                endpoint="alpha",
                token_source="usage",
                size_class=13,
                ratio=0.7891,
                error=0.0031,
                observations=12,
                updated_at=AT,
            )
        ]
    )
    endpoints = {e["name"]: e for e in client.get("/api/v1/endpoints").json()}
    [learnt] = endpoints["alpha"]["calibrations"]
    assert learnt["prompt_tokens"] == 8192 and learnt["observations"] == 12
    assert learnt["token_source"] == "usage" and abs(learnt["typical_error"] - 0.0031) < 1e-9
    assert all(e["calibrations"] == [] for name, e in endpoints.items() if name != "alpha")
    page = client.get("/endpoints/alpha").text
    assert "tokens estimated (usage)" in page and "ratio 0.7891" in page and "0.31 %" in page
    other = next(name for name in endpoints if name != "alpha")
    assert "data-calibration" not in client.get(f"/endpoints/{other}").text
