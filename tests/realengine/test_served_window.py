"""The served-window search against a real model: the simulator's proxy mode in front of
llama-server (Gemma 3 270M, window 2048) with a KV pool of 512 tokens.

Truncating, the proxy keeps the prompt's head up to the pool and the real engine reports the
tokens it read, so the search gets the engine's own signal and verifies it with real
prefills. Swapping a prompt over the pool for stale pages (the incident), it reports 1
prompt token: no signal at all, which the search must neither trust nor stop at.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.canary.served import probe_budget
from kvwatch.probe.chain import WINDOW_FAILURES
from kvwatch.simulator.proxy import run_proxy
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from kvwatch.store.repository import Store
from tests.helpers.store import get_probe
from tests.realengine.probes import Rig, llamacpp_entry, probe_rig
from tests.realengine.server import WINDOW

POOL = 512
TAIL = SimEndpoint(
    "tail", window=WINDOW, kv_pool=POOL, fault=FaultMode.TRUNCATE_TAIL, flavour="llamacpp"
)
STALE = [
    SimEndpoint(name, window=WINDOW, kv_pool=POOL, fault=FaultMode.STALE_KV, flavour="llamacpp")
    for name in ("stale", "stale_pool")
]


@pytest.fixture
async def rig(llama_server_url: str, sqlite_store: Store) -> AsyncIterator[Rig]:
    async with run_proxy(llama_server_url, [TAIL]) as proxy:
        entry = llamacpp_entry(proxy.url_for("tail").removesuffix("/v1"), name="tail")
        async with probe_rig([entry], sqlite_store) as r:
            yield r


@pytest.fixture
async def stale_rig(llama_server_url: str, sqlite_store: Store) -> AsyncIterator[Rig]:
    async with run_proxy(llama_server_url, STALE) as proxy:
        entries = [
            llamacpp_entry(
                proxy.url_for(ep.name).removesuffix("/v1"),
                name=ep.name,
                # The operator's word for the pool (llama.cpp's /props reports n_ctx only).
                **({"kv_pool_tokens": POOL} if ep.name == "stale_pool" else {}),
            )
            for ep in STALE
        ]
        async with probe_rig(entries, sqlite_store) as r:
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
        row = get_probe(rig.store, step.probe_id or 0)
        assert row is not None and row.trigger_probe_id == under.probe_id


async def test_a_real_placeholder_swap_before_any_baseline_is_measured_with_no_error_step(
    stale_rig: Rig,
) -> None:
    """The incident's signature on a real engine, nothing passed yet: under reports 1 prompt
    token. Without the pool the search bisects; with it, the pool is verified by a real
    prefill of 512 tokens and one of 513 swapped out: to the token. No step is an error."""
    rig = stale_rig
    for name in ("stale", "stale_pool"):
        reports = await rig.runner.run_checked(rig.targets[name], ProbeKind.UNDER)
        under = reports[0]
        assert under.verdict in WINDOW_FAILURES, under.reason
        assert under.reported_prompt_tokens == 1
        steps = [r for r in reports if r.kind is ProbeKind.BISECT]
        assert 1 <= len(steps) <= probe_budget(WINDOW)
        assert [r for r in steps if r.verdict is Verdict.ERROR] == [], [r.reason for r in steps]
        record = rig.store.served_windows(name)[name]
        assert record.served_tokens <= POOL < (record.unserved_tokens or 0), record
    record = rig.store.served_windows("stale_pool")["stale_pool"]
    assert (record.served_tokens, record.exact) == (POOL, True)
