"""Canary cost accounting: `kvwatch plan` and the over probe's zero prefill."""

from __future__ import annotations

import json
import subprocess

import httpx

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.config import parse_config
from kvwatch.cost import plan_costs
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import SimEndpoint
from tests.helpers.processes import kvwatch_cmd
from tests.helpers.targets import config_for, sim_endpoint_entry, targets_and_runner

ONE_M = """
endpoints:
  - name: glm-prod
    url: http://10.0.0.1:8000/v1
    flavour: vllm
    model: glm-5.3
    context_window: 1048576
    interval: 5m
    max_tokens: 16
"""


def test_a_1m_under_probe_every_five_minutes_costs_about_302m_prefill_tokens_a_day():
    """The issue's figure: (1,048,576 − 16) × 288 probes a day ≈ 302M."""
    costs = {c.kind: c for c in plan_costs(parse_config(ONE_M).resolved_endpoints())}
    assert costs[ProbeKind.UNDER].prefill_tokens_per_day == 1_048_560 * 288
    assert costs[ProbeKind.OVER].prefill_tokens_per_day == 0
    assert costs[ProbeKind.BASELINE].prefill_tokens_per_day == 1536 * 288
    assert costs[ProbeKind.CAPACITY].prefill_tokens_per_day == 0


def test_an_ollama_over_probe_is_one_token_past_its_window_and_prefills_the_window():
    """Ollama cuts rather than refuses: the over prompt is window + 1 and the cut costs a
    full window of prefill."""
    text = ONE_M.replace("vllm", "ollama").replace("1048576", "8192").replace("5m", "1h")
    costs = {c.kind: c for c in plan_costs(parse_config(text).resolved_endpoints())}
    assert costs[ProbeKind.OVER].prompt_tokens == 8193
    assert costs[ProbeKind.OVER].prefill_tokens_per_day == 8192 * 24


def test_plan_prints_tokens_per_day_and_a_total(tmp_path):
    """`kvwatch plan` shows each probe's daily cost and the total prefill."""
    (tmp_path / "kvwatch.yaml").write_text(ONE_M)
    table = subprocess.run(
        kvwatch_cmd("plan"), cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert table.returncode == 0, table.stderr
    assert "301,985,280" in table.stdout
    assert "total prefill per day: 302,427,648 tokens" in table.stdout
    js = subprocess.run(
        kvwatch_cmd("plan", "--output", "json"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    rows = [json.loads(line) for line in js.stdout.splitlines()]
    assert [r["kind"] for r in rows] == ["under", "over", "baseline", "capacity"]
    assert rows[-1]["prefill_tokens_per_day"] == 0


def test_plan_states_the_precision_of_an_estimated_endpoint():
    """An endpoint whose tokens are estimated gets a note with its margin; exact ones none."""
    from kvwatch.cli import precision_notes

    exact = parse_config(ONE_M).resolved_endpoints()
    assert precision_notes(exact) == []
    estimated = parse_config(ONE_M + "    tokenizer: usage\n").resolved_endpoints()
    [note] = precision_notes(estimated)
    assert note.startswith("glm-prod: tokens are estimated (usage)")
    assert "at least 2 % (20,972 tokens of this window)" in note


def test_an_unknown_window_is_reported_as_unknown_not_zero():
    """No configured window: the cost is unknown until discovery, never a made-up 0 (the over
    probe, refused at admission, costs no prefill whatever the window)."""
    config = parse_config(ONE_M.replace("    context_window: 1048576\n", ""))
    costs = {c.kind: c.prefill_tokens_per_day for c in plan_costs(config.resolved_endpoints())}
    assert costs == {
        ProbeKind.UNDER: None,
        ProbeKind.OVER: 0,
        ProbeKind.BASELINE: None,
        ProbeKind.CAPACITY: 0,
    }


async def test_the_over_probe_adds_no_prefilled_tokens(store):
    """The simulator counts prefilled tokens: an over probe (rejected at admission) adds none."""
    async with (
        run_simulator([SimEndpoint("ep", window=4096)]) as sim,
        httpx.AsyncClient(timeout=None) as client,
    ):
        config = config_for([sim_endpoint_entry(sim, "ep")], database="sqlite:///unused.db")
        targets, runner, metrics = targets_and_runner(config, store, client)
        await runner.run(targets["ep"], ProbeKind.BASELINE)
        before = sim.stats()["ep"]["prefilled_tokens"]
        report = await runner.run(targets["ep"], ProbeKind.OVER)
        assert report.verdict is Verdict.PASS
        assert sim.stats()["ep"]["prefilled_tokens"] == before
        await runner.run(targets["ep"], ProbeKind.UNDER)
        assert sim.stats()["ep"]["prefilled_tokens"] > before
        spent = metrics.registry.get_sample_value(
            "kvwatch_canary_tokens_total", {"endpoint": "ep", "probe": "under", "type": "prompt"}
        )
        assert spent == 4096 - 32


def test_a_burst_costs_its_solo_request_and_the_average_burst_every_cycle():
    """sizes [3, 7, 9, 17] average 9 at once plus the solo request: 10 prompts of 512 tokens
    a cycle, 288 cycles a day at 5m, each answer up to 48 tokens."""
    text = ONE_M + "    probes: [burst]\n"
    (cost,) = plan_costs(parse_config(text).resolved_endpoints())
    assert cost.kind is ProbeKind.BURST
    assert cost.prompt_tokens == 5120
    assert cost.prefill_tokens_per_day == 5120 * 288
    assert cost.completion_tokens_per_day == 10 * 48 * 288


def test_a_cache_cycle_costs_five_documents_most_of_them_served_from_the_cache():
    """document_tokens 3000: five prompts of 3000 a cycle; warm and reuse whole and the
    branch up to its 0.6 split are expected from the cache (7,800), so 7,200 are prefilled;
    four answers of up to 40 tokens and the abort step's one."""
    text = ONE_M + "    probes: [cache]\n"
    (cost,) = plan_costs(parse_config(text).resolved_endpoints())
    assert cost.kind is ProbeKind.CACHE
    assert (cost.prompt_tokens, cost.cached_prompt_tokens) == (15000, 7800)
    assert cost.prefill_tokens_per_day == 7200 * 288
    assert cost.completion_tokens_per_day == 161 * 288
    assert cost.returning_after_seconds is None


def test_a_returning_session_adds_a_cached_step_and_plan_shows_its_age(tmp_path):
    """cache.return_after 30m: six prompts, the returning one expected from the cache; the
    table's note gives the tokens of a cycle and the age it tests."""
    text = ONE_M + "    probes: [cache]\n    cache: {document_tokens: 2000, return_after: 30m}\n"
    (cost,) = plan_costs(parse_config(text).resolved_endpoints())
    assert (cost.prompt_tokens, cost.cached_prompt_tokens) == (12000, 7200)
    assert cost.returning_after_seconds == 1800
    (tmp_path / "kvwatch.yaml").write_text(text)
    table = subprocess.run(
        kvwatch_cmd("plan"), cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert table.returncode == 0, table.stderr
    assert (
        "NOTE: glm-prod: a cache cycle sends 12,000 prompt tokens, of which about 7,200 should "
        "be served from the prefix cache (only the rest is prefilled), and up to 201 answer "
        "tokens; its returning session asks about a document 30m old (kept in memory: a "
        "restart loses them)"
    ) in table.stdout


BUDGETED = ONE_M.replace("    interval: 5m\n", "    budget: {tokens_per_day: 20000000}\n")


def test_plan_shows_an_endpoints_budget_beside_what_its_schedule_plans(tmp_path):
    """With a budget, `kvwatch plan` prints the budget, the paced plan and (no history
    yet) no spend; the under probe's interval is stretched to fit."""
    (tmp_path / "kvwatch.yaml").write_text(BUDGETED)
    table = subprocess.run(
        kvwatch_cmd("plan"), cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert table.returncode == 0, table.stderr
    [spec] = parse_config(BUDGETED).resolved_endpoints()
    planned = spec.budget_planned_per_day
    assert planned is not None and planned <= 20_000_000
    assert (
        f"budget glm-prod: 20,000,000 tokens a day; its schedule plans {planned:,}; "
        "spent in the last 24 h: -"
    ) in table.stdout
    assert not (tmp_path / "kvwatch.db").exists()
    # (1,048,560 + 16 + 1,536 + 16) tokens a run fit 19 times a day: every 76 min.
    assert spec.interval_for(ProbeKind.UNDER) == 76 * 60.0
