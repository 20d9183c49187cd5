"""A burst probe's per-request evidence, where people look for it: its page and the API."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from fastapi.testclient import TestClient

from kvwatch.canary.model import BurstOutcome, BurstRequest
from kvwatch.store import NewProbe, ProbeOutcome
from kvwatch.web.settings import WebSettings
from tests.helpers.store import Store
from tests.web.conftest import T0, AppFactory

SOLO = "KVW-5010-5010-5010"
FIRST = "KVW-F1F1-F1F1-F1F1"
SECOND = "KVW-5EC0-5EC0-5EC0"


def _burst_probe(
    store: Store,
    requests: tuple[BurstRequest, ...] | None = None,
    verdict: str = "burst_leak",
) -> int:
    """A finished burst probe with ``requests`` (by default a leak between two members)."""
    endpoint_id = store.upsert_endpoint(
        "trt", "http://10.0.0.9:8000/trt/v1", "openai", "llama", 8192, None, {}
    )
    new = NewProbe(
        endpoint="trt",
        endpoint_id=endpoint_id,
        kind="burst",
        started_at=T0,
        replica="kvwatch-0",
        model="llama",
        planned_prompt_tokens=1536,
        target_prompt_tokens=1536,
        max_tokens=48,
        token_source="words",
        tokenize_calls=0,
        marker=SOLO,
        marker_depth=0.0,
        streamed=True,
        burst_markers=(FIRST, SECOND),
    )
    probe_id = store.begin_probe(new)
    requests = requests or (
        BurstRequest(0, 1, SOLO, "owl", BurstOutcome.RIGHT, 200, True, "owl", answer=f"{SOLO} owl"),
        BurstRequest(
            1, 2, FIRST, "fox", BurstOutcome.LEAK, 200, False, "yak", siblings=(2,), answer="x yak"
        ),
        BurstRequest(2, 2, SECOND, "yak", BurstOutcome.RIGHT, 200, True, "yak", answer="y yak"),
    )
    outcome = ProbeOutcome(
        verdict=verdict,
        reason=f"a {verdict} burst",
        finished_at=T0 + timedelta(seconds=2),
        http_status=200,
        marker_found=False,
        burst=requests,
    )
    store.finish_probe(probe_id, replace(outcome))
    return probe_id


def test_the_api_lists_every_request_of_the_burst(store: Store, client: TestClient) -> None:
    """/api/v1/probes/{id}: one entry per request, the solo first, with whose marker it held."""
    probe_id = _burst_probe(store)
    body = client.get(f"/api/v1/probes/{probe_id}").json()
    assert [(b["request"], b["size"], b["outcome"]) for b in body["burst"]] == [
        (0, 1, "right"),
        (1, 2, "leak"),
        (2, 2, "right"),
    ]
    leak = body["burst"][1]
    assert (leak["marker"], leak["expected"], leak["answered"]) == (FIRST, "fox", "yak")
    assert (leak["siblings"], leak["answer"]) == ([2], "x yak")
    assert body["depths"] == []


def test_the_probe_page_shows_a_row_per_request(store: Store, client: TestClient) -> None:
    """The page's burst table names the solo request and the member holding another's marker."""
    page = client.get(f"/probes/{_burst_probe(store)}").text
    assert '<dd id="burst">' in page
    assert '<tr data-outcome="right"><td>solo</td><td>1</td>' in page
    assert "holds the marker of request 2" in page


def test_a_control_is_listed_after_the_burst_as_its_member_again_alone(
    store: Store, client: TestClient
) -> None:
    """A wrong member's control: the API says control, the page says "again alone"."""
    miscopied = "KVW-F1F1-F1F1-F1F fox"
    requests = (
        BurstRequest(0, 1, SOLO, "owl", BurstOutcome.RIGHT, 200, True, "owl", answer="s owl"),
        BurstRequest(1, 2, FIRST, "fox", BurstOutcome.WRONG, 200, False, "fox", answer=miscopied),
        BurstRequest(2, 2, SECOND, "yak", BurstOutcome.RIGHT, 200, True, "yak", answer="y yak"),
        BurstRequest(
            1,
            1,
            FIRST,
            "fox",
            BurstOutcome.WRONG,
            200,
            False,
            "fox",
            answer=miscopied,
            control=True,
        ),
    )
    probe_id = _burst_probe(store, requests, "canary_ineffective")
    body = client.get(f"/api/v1/probes/{probe_id}").json()
    assert [(b["request"], b["size"], b["control"]) for b in body["burst"]] == [
        (0, 1, False),
        (1, 2, False),
        (2, 2, False),
        (1, 1, True),
    ]
    page = client.get(f"/probes/{probe_id}").text
    assert '<tr data-outcome="wrong"><td>1 <span class="sub">again alone</span></td><td>1</td>' in (
        page
    )


def test_answers_are_withheld_when_excerpts_are_off(store: Store, make_app: AppFactory) -> None:
    """web.answer_excerpts off: no request's answer is shown, the rest of the evidence is."""
    probe_id = _burst_probe(store)
    with TestClient(make_app(WebSettings(answer_excerpts=False))) as c:
        body = c.get(f"/api/v1/probes/{probe_id}").json()
        page = c.get(f"/probes/{probe_id}").text
    assert [b["answer"] for b in body["burst"]] == [None, None, None]
    assert [b["answered"] for b in body["burst"]] == ["owl", "yak", "yak"]
    assert "x yak" not in page


def test_another_kinds_probe_has_no_burst_entries(
    client: TestClient, history: dict[str, int]
) -> None:
    """A several-depth or single-marker probe's evidence is never read as a burst."""
    body = client.get(f"/api/v1/probes/{history['b-under']}").json()
    assert body["burst"] == []
