"""A cache probe's per-step evidence, where people look for it: its page, the API and
`kvwatch show`."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from click.testing import CliRunner
from fastapi.testclient import TestClient

from kvwatch.canary.model import CacheOutcome, CacheStep
from kvwatch.cli import main
from kvwatch.store import NewProbe, ProbeOutcome
from kvwatch.web.settings import WebSettings
from tests.helpers.store import Store
from tests.web.conftest import T0, AppFactory

COLD = "KVW-C01D-C01D-C01D"
WARM = "KVW-3A53-3A53-3A53"
BRANCH = "KVW-B2A2-B2A2-B2A2"


def _cache_probe(store: Store) -> int:
    endpoint_id = store.upsert_endpoint(
        "vllm-a", "http://10.0.0.9:8000/v1", "vllm", "qwen", 8192, None, {}
    )
    new = NewProbe(
        endpoint="vllm-a",
        endpoint_id=endpoint_id,
        kind="cache",
        started_at=T0,
        replica="kvwatch-0",
        model="qwen",
        planned_prompt_tokens=15000,
        target_prompt_tokens=15000,
        max_tokens=40,
        token_source="words",
        tokenize_calls=0,
        marker=COLD,
        marker_depth=0.0,
        streamed=False,
        burst_markers=(WARM, BRANCH),
    )
    probe_id = store.begin_probe(new)
    steps = (
        CacheStep("cold", "A", "jade", COLD, CacheOutcome.RIGHT, 200, None, 3000, 9, True),
        CacheStep("warm", "A", "teal", WARM, CacheOutcome.RIGHT, 200, 2992, 3000, 9, True),
        CacheStep(
            "branch",
            "A'",
            "jade",
            BRANCH,
            CacheOutcome.WRONG,
            200,
            2992,
            3000,
            9,
            False,
            answered=("A jade",),
            answer=f"The jade code is {COLD}.",
        ),
    )
    outcome = ProbeOutcome(
        verdict="cache_corrupt",
        reason="the branch step answered wrong from the cache",
        finished_at=T0 + timedelta(seconds=2),
        http_status=200,
        marker_found=False,
        cached_prompt_tokens=5984,
        cache=steps,
    )
    store.finish_probe(probe_id, outcome)
    return probe_id


def test_the_api_lists_every_step_with_its_cached_tokens(store: Store, client: TestClient) -> None:
    """/api/v1/probes/{id}: one entry per step, cold first, with what the cache served."""
    probe_id = _cache_probe(store)
    body = client.get(f"/api/v1/probes/{probe_id}").json()
    assert [(c["step"], c["cached_tokens"], c["outcome"]) for c in body["cache"]] == [
        ("cold", None, "right"),
        ("warm", 2992, "right"),
        ("branch", 2992, "wrong"),
    ]
    assert body["cache"][2]["answered"] == ["A jade"]
    assert body["cached_prompt_tokens"] == 5984
    assert body["burst"] == [] and body["depths"] == []


def test_the_openapi_schema_describes_the_cache_steps(client: TestClient) -> None:
    """The API's schema documents each step's fields."""
    schemas = client.get("/api/v1/openapi.json").json()["components"]["schemas"]
    assert "cached_tokens" in schemas["CacheStep"]["properties"]
    assert "cache" in schemas["Probe"]["properties"]


def test_the_probe_page_shows_a_row_per_step(store: Store, client: TestClient) -> None:
    """The page's cache table shows each step, its cached tokens, the wrong code's origin."""
    page = client.get(f"/probes/{_cache_probe(store)}").text
    assert '<dd id="cache">' in page
    assert "<td>cold</td><td>A</td><td>jade</td>" in page
    assert "not reported" in page
    assert "gave the code of A jade" in page
    assert 'id="cached-tokens"' in page


def test_step_answers_are_withheld_when_excerpts_are_off(
    store: Store, make_app: AppFactory
) -> None:
    """web.answer_excerpts off: no step's answer is shown, the rest of the evidence is."""
    probe_id = _cache_probe(store)
    with TestClient(make_app(WebSettings(answer_excerpts=False))) as c:
        body = c.get(f"/api/v1/probes/{probe_id}").json()
    assert [c["answer"] for c in body["cache"]] == [None, None, None]
    assert body["cache"][2]["answered"] == ["A jade"]


def test_kvwatch_show_lists_each_step(store: Store, tmp_path: Path, db_url: str) -> None:
    """`kvwatch show ID` prints one line per step with its cached tokens and outcome."""
    probe_id = _cache_probe(store)
    config = tmp_path / "kvwatch.yaml"
    config.write_text(f"database: {db_url}\nendpoints: []\n")
    shown = CliRunner().invoke(main, ["show", str(probe_id), "--config", str(config)])
    assert shown.exit_code == 0, shown.output
    assert "  step branch   A'   jade     cached  2,992 WRONG, gave the code of A jade" in (
        shown.stdout
    )
    assert "  step cold     A    jade     cached      - RIGHT" in shown.stdout
