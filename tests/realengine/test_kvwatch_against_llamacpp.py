"""kvwatch's real probes against llama.cpp's server running a real model (window 2048, one slot).

Everything is kvwatch's own path: a validated config with flavour ``llamacpp`` and tokenizer
``server``, the engine adapter built from it, the planner counting with the server's
``/apply-template`` + ``/tokenize``, the runner, the verdicts, the SQLite store. The window is
left out of the config, so every probe below is also sized from the window kvwatch discovered
in ``/props``.

The acceptance rule these sizes rest on (docs/llamacpp-facts.md): llama.cpp rejects a prompt
iff ``prompt >= n_ctx``, whatever ``max_tokens``; so *under* is ``n_ctx - max_tokens`` (the
whole answer fits) and *over* is ``n_ctx`` exactly.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.canary.sizing import AcceptanceRule, target_prompt_tokens
from kvwatch.store.repository import Store
from tests.helpers.store import get_probe
from tests.realengine.probes import BASELINE_TOKENS, MAX_TOKENS, Rig, llamacpp_entry, probe_rig
from tests.realengine.server import WINDOW


@pytest.fixture
async def rig(llama_server_url: str, sqlite_store: Store) -> AsyncIterator[Rig]:
    async with probe_rig([llamacpp_entry(llama_server_url)], sqlite_store) as r:
        yield r


async def test_the_window_is_discovered_from_props_as_the_slot_context(rig: Rig) -> None:
    """With no context_window configured, discovery reads n_ctx per slot: window and pool."""
    target = rig.targets["llama"]
    assert target.spec.context_window is None
    found = await target.engine.discover()
    assert (found.context_window, found.kv_pool_tokens) == (WINDOW, WINDOW)
    assert found.detail == "1 slot(s), n_ctx per slot"


def test_kvwatch_sizes_llamacpp_probes_by_the_measured_rule() -> None:
    """PROMPT_BELOW_WINDOW: under leaves room for the answer, over is n_ctx itself."""

    def size(kind: ProbeKind) -> int:
        return target_prompt_tokens(
            kind,
            rule=AcceptanceRule.PROMPT_BELOW_WINDOW,
            window=WINDOW,
            max_tokens=MAX_TOKENS,
            baseline_tokens=BASELINE_TOKENS,
        )

    assert size(ProbeKind.UNDER) == WINDOW - MAX_TOKENS
    assert size(ProbeKind.OVER) == WINDOW
    assert size(ProbeKind.BASELINE) == BASELINE_TOKENS


async def test_the_under_probe_passes_with_the_marker_recalled_and_every_token_read(
    rig: Rig,
) -> None:
    """n_ctx - max_tokens tokens: accepted, the whole answer fits, usage equals the plan."""
    target = rig.targets["llama"]
    assert target.engine.rule is AcceptanceRule.PROMPT_BELOW_WINDOW
    report = await rig.runner.run(target, ProbeKind.UNDER)
    assert report.verdict is Verdict.PASS, report.reason
    assert report.marker_found
    assert target.window == WINDOW  # discovered on first use
    assert report.planned_prompt_tokens == WINDOW - MAX_TOKENS
    assert report.reported_prompt_tokens == report.planned_prompt_tokens
    row = get_probe(rig.store, report.probe_id)
    assert row is not None
    assert row.target_prompt_tokens == WINDOW - MAX_TOKENS
    # The boundary's other half: at this size the answer still gets all max_tokens.
    assert row.completion_tokens == MAX_TOKENS
    assert row.http_status == 200


async def test_the_over_probe_of_exactly_n_ctx_tokens_is_rejected_as_a_context_error(
    rig: Rig,
) -> None:
    """A prompt of n_ctx tokens: 400 exceed_context_size_error, which kvwatch passes."""
    report = await rig.runner.run(rig.targets["llama"], ProbeKind.OVER)
    assert report.verdict is Verdict.PASS, report.reason
    assert report.status == 400
    assert report.planned_prompt_tokens == WINDOW
    row = get_probe(rig.store, report.probe_id)
    assert row is not None and row.error_body is not None
    error = json.loads(row.error_body)["error"]
    assert error["type"] == "exceed_context_size_error"
    # The server counted the prompt as kvwatch planned it, to the token.
    assert (error["n_prompt_tokens"], error["n_ctx"]) == (WINDOW, WINDOW)


async def test_the_baseline_probe_passes_with_planned_equal_to_reported(rig: Rig) -> None:
    """A short prompt: the marker is recalled and usage matches the plan exactly."""
    report = await rig.runner.run(rig.targets["llama"], ProbeKind.BASELINE)
    assert report.verdict is Verdict.PASS, report.reason
    assert report.marker_found
    assert report.planned_prompt_tokens == BASELINE_TOKENS
    assert report.reported_prompt_tokens == BASELINE_TOKENS
