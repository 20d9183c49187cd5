"""The trace id of a probe, where people look for it: its page, the API and its schema."""

from __future__ import annotations

from fastapi.testclient import TestClient

from tests.web.conftest import TRACE_ID


def test_the_api_gives_the_trace_id_and_null_for_a_probe_from_before_tracing(
    client: TestClient, history: dict[str, int]
) -> None:
    """/api/v1/probes/{id}: the stored trace id; null for a row stored without one."""
    traced = client.get(f"/api/v1/probes/{history['b-under']}").json()
    untraced = client.get(f"/api/v1/probes/{history['b-confirm']}").json()
    assert (traced["trace_id"], untraced["trace_id"]) == (TRACE_ID, None)


def test_the_openapi_schema_documents_the_trace_id_as_32_hex_digits_or_null(
    client: TestClient,
) -> None:
    """The Probe schema has trace_id: a nullable string of 32 lower-case hex digits."""
    schema = client.get("/api/v1/openapi.json").json()
    field = schema["components"]["schemas"]["Probe"]["properties"]["trace_id"]
    string, null = field["anyOf"]
    assert string == {"type": "string", "pattern": "^[0-9a-f]{32}$"}
    assert null == {"type": "null"}
    assert "traceparent" in field["description"]


def test_the_probe_page_shows_the_trace_id_or_says_there_is_none(
    client: TestClient, history: dict[str, int]
) -> None:
    """The evidence list has a trace id line: the id in a code element, or "none"."""
    traced = client.get(f"/probes/{history['b-under']}").text
    assert f'<dt>trace id</dt><dd><code id="trace-id">{TRACE_ID}</code>' in traced
    untraced = client.get(f"/probes/{history['b-confirm']}").text
    assert '<dt>trace id</dt><dd><span class="muted">none</span></dd>' in untraced
    assert 'id="trace-id"' not in untraced
