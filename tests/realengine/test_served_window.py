"""The served-window search against a real model: the simulator's proxy mode truncating in
front of llama-server (Gemma 3 270M, window 2048) to a KV pool of 512 tokens.

The proxy keeps the prompt's head up to the pool and the real engine reports the tokens it
read, so the search gets the engine's own signal and verifies it with real prefills.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.canary.served import probe_budget
from kvwatch.simulator.proxy import run_proxy
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from kvwatch.store.repository import Store
from tests.realengine.probes import Rig, llamacpp_entry, probe_rig
from tests.realengine.server import WINDOW

POOL = 512
TAIL = SimEndpoint(
    "tail", window=WINDOW, kv_pool=POOL, fault=FaultMode.TRUNCATE_TAIL, flavour="llamacpp"
)


@pytest.fixture
async def rig(llama_server_url: str, sqlite_store: Store) -> AsyncIterator[Rig]:
    async with run_proxy(llama_server_url, [TAIL]) as proxy:
        entry = llamacpp_entry(proxy.url_for("tail").removesuffix("/v1"), name="tail")
        async with probe_rig([entry], sqlite_store) as r:
            yield r


async def test_a_real_truncation_is_measured_at_the_pool_by_real_prefills(rig: Rig) -> None:
    """Under is cut to the pool and reported so; the bisect probes verify it on the real
    model within the budget, and the stored window brackets the pool."""
    target = rig.targets["tail"]
    assert (await rig.runner.run(target, ProbeKind.BASELINE)).verdict is Verdict.PASS
    reports = await rig.runner.run_checked(target, ProbeKind.UNDER)
    under = reports[0]
    assert under.verdict is Verdict.TRUNCATED, under.reason
    steps = [r for r in reports if r.kind is ProbeKind.BISECT]
    assert 1 <= len(steps) <= probe_budget(WINDOW)
    # The first step is the engine's own count of what it read.
    assert steps[0].planned_prompt_tokens == under.reported_prompt_tokens
    assert steps[0].verdict is Verdict.PASS, steps[0].reason
    record = rig.store.served_windows("tail")["tail"]
    assert record.served_tokens <= POOL < (record.unserved_tokens or 0)
    if under.reported_prompt_tokens == POOL:
        assert (record.served_tokens, record.exact) == (POOL, True)
    for step in steps:
        row = rig.store.get_probe(step.probe_id or 0)
        assert row is not None and row.trigger_probe_id == under.probe_id
