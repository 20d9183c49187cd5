"""The burst probe on llama-server with the real model: a healthy engine passes, and a batch
that swaps requests (injected by the proxy) is a burst_leak.

Its own server with four slots (2,048 tokens each), so three requests at once are decoded in
one batch rather than queued behind one slot as on the suite's shared server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvwatch.canary.model import BurstOutcome, ProbeKind, Verdict
from kvwatch.simulator.proxy import run_proxy
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from kvwatch.store.repository import Store
from tests.helpers.store import get_probe
from tests.realengine.probes import llamacpp_entry, probe_rig
from tests.realengine.server import GEMMA_TEMPLATE_ARGS, llama_server

SLOTS = 4


@pytest.fixture(scope="module")
def slotted_server_url(
    llama_server_binary: Path, gemma_gguf: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """llama-server with the Gemma template and four slots."""
    log = tmp_path_factory.mktemp("llama-server-slots") / "server.log"
    with llama_server(
        llama_server_binary, gemma_gguf, *GEMMA_TEMPLATE_ARGS, log=log, slots=SLOTS
    ) as base:
        yield base


async def test_a_healthy_burst_passes_on_llama_server(
    slotted_server_url: str, sqlite_store: Store
) -> None:
    """Solo then three at once: every answer holds its own marker and its own word, or a
    member the model gets wrong is wrong alone too (Gemma 3 270M miscopies about one prompt
    in a hundred, docs/llamacpp-facts.md): never burst_wrong."""
    entry = llamacpp_entry(
        slotted_server_url, probes=["burst"], burst={"sizes": [SLOTS - 1], "prompt_tokens": 128}
    )
    async with probe_rig([entry], sqlite_store) as rig:
        report = await rig.runner.run(rig.targets["llama"], ProbeKind.BURST)
    row = get_probe(sqlite_store, report.probe_id)
    assert row is not None
    answers = [(r.control, r.outcome.value, r.answer) for r in row.burst]
    assert report.verdict in (Verdict.PASS, Verdict.CANARY_INEFFECTIVE), (report.reason, answers)
    solo, *members = [r for r in row.burst if not r.control]
    assert [r.size for r in members] == [SLOTS - 1] * (SLOTS - 1)
    if solo.outcome is not BurstOutcome.RIGHT:
        # The solo prompt is one of the model's misses (about one in a hundred): the canary
        # cannot work this cycle, and no control is sent.
        assert report.verdict is Verdict.CANARY_INEFFECTIVE, answers
        assert report.reason.startswith("the solo request"), report.reason
        assert not any(r.control for r in row.burst), answers
        return
    wrong = {r.index for r in members if r.outcome is not BurstOutcome.RIGHT}
    controls = {r.index: r.outcome for r in row.burst if r.control}
    # A member wrong in the batch was sent again alone, and was wrong there too.
    assert controls == dict.fromkeys(wrong, BurstOutcome.WRONG), answers
    assert (report.verdict is Verdict.PASS) == (not wrong)
    # Each request is about prompt_tokens of the engine's own count.
    assert all(100 <= (r.prompt_tokens or 0) <= 200 for r in row.burst)


async def test_a_batch_that_swaps_prompts_is_a_burst_leak_on_the_real_model(
    slotted_server_url: str, sqlite_store: Store
) -> None:
    """batch_mix injected by the proxy in front of the four-slot server: the real model
    answers each concurrent request from the next one's prompt, so it gives back the next
    request's marker (burst_leak), while the solo request stays right."""
    batch = SimEndpoint("batch", fault=FaultMode.BATCH_MIX, batch_mix_at=SLOTS - 1)
    async with run_proxy(slotted_server_url, [batch]) as proxy:
        entry = llamacpp_entry(
            proxy.url_for("batch").removesuffix("/v1"),
            name="batch",
            probes=["burst"],
            burst={"sizes": [SLOTS - 1], "prompt_tokens": 128},
        )
        async with probe_rig([entry], sqlite_store) as rig:
            report = await rig.runner.run(rig.targets["batch"], ProbeKind.BURST)
    row = get_probe(sqlite_store, report.probe_id)
    assert row is not None
    assert report.verdict is Verdict.BURST_LEAK, (report.reason, [r.answer for r in row.burst])
    assert row.burst[0].outcome is BurstOutcome.RIGHT
    # Each member answers from the next one's prompt. Gemma 3 270M now and then miscopies a
    # marker it was given (2 of 240 answers, docs/llamacpp-facts.md), so one member may hold
    # none (seen in CI: the first held nothing); one that holds a marker must hold the next
    # member's.
    held = [r.siblings for r in row.burst[1:]]
    expected = [(2,), (3,), (1,)]
    assert all(got in ((), want) for got, want in zip(held, expected, strict=True)), held
    assert held.count(()) <= 1, held
