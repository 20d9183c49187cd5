"""The JSON API returns exactly the stored history, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from kvwatch.web.settings import WebSettings
from tests.web.conftest import LEAKED, TRACE_ID, AppFactory


def _leaked_probe(ids: dict[str, int], **overrides: Any) -> dict[str, Any]:
    pid = ids["b-under"]
    probe = {
        "id": pid,
        "url": f"/probes/{pid}",
        "endpoint": "beta",
        "kind": "under",
        "state": "done",
        "verdict": "foreign_marker",
        "severity": "critical",
        "tone": "critical",
        "reason": "foreign_marker (test)",
        "started_at": "2026-03-01T12:04:00Z",
        "finished_at": "2026-03-01T12:04:03Z",
        "replica": "kvwatch-0",
        "region": None,
        "tenant": None,
        "model": "glm-5.3",
        "planned_prompt_tokens": 8176,
        "target_prompt_tokens": 8176,
        "reported_prompt_tokens": 8176,
        "completion_tokens": 9,
        "max_tokens": 16,
        "token_source": "server",
        "tokenize_calls": 1,
        "marker": "KVW-CCCC-CCCC-CCC1",
        "marker_depth": 0.0,
        "marker_found": False,
        "foreign_markers": [
            {
                "marker": LEAKED,
                "probe_id": ids["b-base"],
                "endpoint": "beta",
                "tenant": None,
                "issued_at": "2026-03-01T12:03:00Z",
                "url": f"/probes/{ids['b-base']}",
            }
        ],
        "depths": [],
        "lost": None,
        "burst": [],
        "cache": [],
        "cached_prompt_tokens": None,
        "http_status": 200,
        "finish_reason": "stop",
        "streamed": True,
        "answer_excerpt": f"The code is {LEAKED}. Also: Alice's card 4111-1111",
        "answer_excerpt_withheld": False,
        "error_body": None,
        "error_detail": None,
        "ttfb_seconds": 1.5,
        "duration_seconds": 3.0,
        "confirms_probe_id": None,
        "confirmed_by": [ids["b-confirm"]],
        "trigger_probe_id": None,
        "trace_id": TRACE_ID,
        "change_id": None,
    }
    probe.update(overrides)
    return probe


def test_one_probe_carries_all_its_evidence(client: TestClient, history: dict[str, int]) -> None:
    """/api/v1/probes/{id} returns every evidence field, the leak and its confirmation."""
    response = client.get(f"/api/v1/probes/{history['b-under']}")
    assert response.status_code == 200
    assert response.json() == _leaked_probe(history)


def test_excerpts_can_be_withheld_or_bounded(make_app: AppFactory, history: dict[str, int]) -> None:
    """answer_excerpts=False withholds the excerpt; excerpt_chars cuts it with an ellipsis."""
    path = f"/api/v1/probes/{history['b-under']}"
    off = TestClient(make_app(WebSettings(answer_excerpts=False))).get(path).json()
    assert (off["answer_excerpt"], off["answer_excerpt_withheld"]) == (None, True)
    short = TestClient(make_app(WebSettings(excerpt_chars=11))).get(path).json()
    assert (short["answer_excerpt"], short["answer_excerpt_withheld"]) == ("The code is…", False)
    page = TestClient(make_app(WebSettings(answer_excerpts=False))).get("/api/v1/probes").json()
    assert {p["answer_excerpt"] for p in page["probes"]} == {None}


def test_endpoints_list_the_latest_verdict_per_kind(
    client: TestClient, history: dict[str, int]
) -> None:
    """/api/v1/endpoints gives each endpoint's latest finished probe per kind and its tone."""

    def brief(key: str, kind: str, verdict: str, tone: str, at: str, d: float) -> dict[str, Any]:
        pid = history[key]
        return {
            "id": pid,
            "kind": kind,
            "state": "done",
            "verdict": verdict,
            "tone": tone,
            "started_at": at,
            "duration_seconds": d,
            "url": f"/probes/{pid}",
        }

    common = {
        "flavour": "vllm",
        "model": "glm-5.3",
        "context_window": 8192,
        "kv_pool_tokens": 6144,
        "served_window_tokens": None,
        "served_window": None,
        "calibrations": [],
        "labels": {},
    }
    assert client.get("/api/v1/endpoints").json() == [
        {
            "name": "alpha",
            "url": "http://10.0.0.1:8000/alpha/v1",
            **common,
            "tone": "ok",
            "latest": {
                "under": brief("a-under", "under", "pass", "ok", "2026-03-01T12:00:00Z", 2.0),
                "over": brief("a-over", "over", "pass", "ok", "2026-03-01T12:01:00Z", 0.5),
            },
        },
        {
            "name": "beta",
            "url": "http://10.0.0.1:8000/beta/v1",
            **common,
            "tone": "critical",
            "latest": {
                "under": brief(
                    "b-confirm", "under", "foreign_marker", "critical", "2026-03-01T12:05:00Z", 4.0
                ),
                "baseline": brief("b-base", "baseline", "pass", "ok", "2026-03-01T12:03:00Z", 1.0),
            },
        },
    ]


def test_probes_are_filtered_and_paged_with_a_cursor(
    client: TestClient, history: dict[str, int]
) -> None:
    """Filters narrow the list; `next` fed back as before_id walks older pages to the end."""

    def ids(query: str) -> tuple[list[int], int | None]:
        body = client.get(f"/api/v1/probes?{query}").json()
        return [p["id"] for p in body["probes"]], body["next"]

    h = history
    newest_first = ["b-running", "b-confirm", "b-under", "b-base", "a-over", "a-under"]
    assert ids("") == ([h[k] for k in newest_first], None)
    assert ids("limit=4") == ([h[k] for k in newest_first[:4]], h["b-base"])
    assert ids(f"limit=4&before_id={h['b-base']}") == ([h["a-over"], h["a-under"]], None)
    assert ids("endpoint=alpha") == ([h["a-over"], h["a-under"]], None)
    assert ids("kind=under&verdict=foreign_marker") == ([h["b-confirm"], h["b-under"]], None)
    window = "since=2026-03-01T12:01:00Z&until=2026-03-01T12:04:00%2B00:00"
    assert ids(window) == ([h["b-base"], h["a-over"]], None)
    assert ids("endpoint=nobody") == ([], None)
    full = client.get("/api/v1/probes?verdict=foreign_marker&limit=1").json()
    assert full == {
        "probes": [
            _leaked_probe(
                history,
                id=h["b-confirm"],
                url=f"/probes/{h['b-confirm']}",
                started_at="2026-03-01T12:05:00Z",
                finished_at="2026-03-01T12:05:04Z",
                marker="KVW-CCCC-CCCC-CCC2",
                answer_excerpt="The code is KVW-...",
                ttfb_seconds=2.0,
                duration_seconds=4.0,
                confirms_probe_id=h["b-under"],
                confirmed_by=[],
                trace_id=None,
            )
        ],
        "next": h["b-confirm"],
    }


def test_the_summary_counts_verdicts_durations_and_tokens(
    client: TestClient, history: dict[str, int]
) -> None:
    """The 24 h summary of beta: pass rate, counts, percentiles, tokens; running counted apart."""
    response = client.get("/api/v1/endpoints/beta/summary?window=24h")
    assert response.json() == {
        "endpoint": "beta",
        "since": "2026-02-28T13:00:00Z",
        "until": "2026-03-01T13:00:00Z",
        "total": 4,
        "finished": 3,
        "running": 1,
        "interrupted": 0,
        "verdicts": {"foreign_marker": 2, "pass": 1},
        "pass_rate": 1 / 3,
        "p50_duration_seconds": 3.0,
        "p95_duration_seconds": 3.9,
        "prompt_tokens": 1536 + 8176 + 8176,
        "completion_tokens": 8 + 9 + 9,
        "tokens_spent": 1536 + 8176 + 8176 + 8 + 9 + 9,
    }
    early = client.get("/api/v1/endpoints/beta/summary?window=1m&until=2026-03-01T12:04:00Z").json()
    assert (early["total"], early["verdicts"], early["pass_rate"]) == (1, {"pass": 1}, 1.0)


def test_alerts_list_firing_then_recently_resolved(
    client: TestClient, history: dict[str, int]
) -> None:
    """Firing alerts come first; resolved ones only within resolved_within (default 24h)."""
    pid = history["b-confirm"]
    assert client.get("/api/v1/alerts").json() == {
        "alerts": [
            {
                "alertname": "KVWatchCrossRequestLeak",
                "endpoint": "beta",
                "probe": "under",
                "state": "firing",
                "severity": "critical",
                "starts_at": "2026-03-01T12:05:00Z",
                "ends_at": None,
                "updated_at": "2026-03-01T12:05:00Z",
                "failures": 2,
                "last_probe_id": pid,
                "last_probe_url": f"/probes/{pid}",
                "labels": {"alertname": "KVWatchCrossRequestLeak", "endpoint": "beta"},
                "annotations": {"summary": "beta leaked another request's marker"},
                "generator_url": f"http://kvwatch.example/probes/{pid}",
            },
            {
                "alertname": "KVWatchProbeFailing",
                "endpoint": "alpha",
                "probe": "under",
                "state": "resolved",
                "severity": "warning",
                "starts_at": "2026-03-01T10:00:00Z",
                "ends_at": "2026-03-01T12:30:00Z",
                "updated_at": "2026-03-01T12:30:00Z",
                "failures": 0,
                "last_probe_id": None,
                "last_probe_url": None,
                "labels": {},
                "annotations": {},
                "generator_url": None,
            },
        ]
    }
    week = client.get("/api/v1/alerts?resolved_within=7d").json()["alerts"]
    assert [a["probe"] for a in week] == ["under", "under", "over"]


def test_bad_parameters_get_a_clear_4xx(client: TestClient, history: dict[str, int]) -> None:
    """Unknown ids, stale cursors, naive times and bad windows are 4xx with a sentence."""
    cases = {
        "/api/v1/probes/999999": (404, "no probe 999999"),
        "/api/v1/probes?before_id=999999": (
            400,
            "before_id 999999 names no stored probe (pruned?); start again without it",
        ),
        "/api/v1/probes?since=2026-03-01T13:00:00Z&until=2026-03-01T12:00:00Z": (
            400,
            "since must be before until",
        ),
        "/api/v1/endpoints/nobody/summary": (404, "no endpoint named 'nobody'"),
        "/api/v1/endpoints/beta/summary?window=400d": (
            400,
            "window '400d' is longer than the maximum of 90d",
        ),
        "/api/v1/alerts?resolved_within=1x": (
            400,
            "resolved_within '1x': must be a duration like 30s, 15m or 1h",
        ),
    }
    for path, (status, detail) in cases.items():
        response = client.get(path)
        assert (response.status_code, response.json()["detail"]) == (status, detail), path
    naive = client.get("/api/v1/probes?since=2026-03-01T12:00:00")
    assert naive.status_code == 422
    assert naive.json()["detail"][0]["msg"] == "Input should have timezone info"
    assert client.get("/api/v1/probes?verdict=fine").status_code == 422
    assert client.get("/api/v1/probes?endpoint=a%00b").status_code == 422
