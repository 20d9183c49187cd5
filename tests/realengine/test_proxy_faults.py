"""Every fault verdict against a real model's answers: the simulator's proxy mode in front of
llama-server (Gemma 3 270M, window 2048), probed by kvwatch exactly as in production.

The proxied endpoints advertise the real window (discovered through the proxy's pass-through
``/props``) with a KV pool of 512 tokens, so an *under* probe (2,016 tokens) is over the pool
and the pool faults act on it; *over* probes (2,048 tokens) meet llama.cpp's real 400. The
small pool keeps the real prefills short: a cut or failed prompt is prefilled only up to it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.probe.model import ProbeReport, Target
from kvwatch.simulator.proxy import run_proxy
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from kvwatch.store.repository import Store
from tests.helpers.store import get_probe
from tests.realengine.probes import Rig, llamacpp_entry, probe_rig
from tests.realengine.server import WINDOW

POOL = 512

PROXIED = [
    SimEndpoint(fault.value, window=WINDOW, kv_pool=POOL, fault=fault, flavour="llamacpp")
    for fault in (
        FaultMode.STALE_KV,
        FaultMode.TRUNCATE_HEAD,
        FaultMode.ACCEPT_OVER_LIMIT,
        FaultMode.STREAM_ERROR_FRAME,
        FaultMode.WRONG_STATUS,
    )
] + [
    # Two tenants share one engine: the proxy tells them apart by the key each presents.
    SimEndpoint(
        "stale_kv_tenants",
        window=WINDOW,
        kv_pool=POOL,
        fault=FaultMode.STALE_KV,
        flavour="llamacpp",
    )
]
TENANTS = [
    {"name": "acme", "api_key": "sk-acme-real"},
    {"name": "globex", "api_key": "sk-globex-real"},
]


@pytest.fixture
async def rig(llama_server_url: str, sqlite_store: Store) -> AsyncIterator[Rig]:
    async with run_proxy(llama_server_url, PROXIED) as proxy:
        entries = [
            llamacpp_entry(
                proxy.url_for(ep.name).removesuffix("/v1"),
                name=ep.name,
                **({"tenants": TENANTS} if ep.name == "stale_kv_tenants" else {}),
            )
            for ep in PROXIED
        ]
        async with probe_rig(entries, sqlite_store) as r:
            yield r


async def recalled_baseline(rig: Rig, target: Target) -> ProbeReport:
    """A baseline the model recalled: its marker is what the stale cache will serve next.

    Gemma 3 270M misses a short prompt's code now and then (seen once in a full suite run);
    a second fresh baseline is a new prompt, not a retry of the assertion under test."""
    baseline = await rig.runner.run(target, ProbeKind.BASELINE)
    for _ in range(2):
        if baseline.verdict is Verdict.PASS:
            break
        baseline = await rig.runner.run(target, ProbeKind.BASELINE)
    return baseline


async def test_stale_kv_makes_the_real_model_repeat_an_earlier_probes_marker(rig: Rig) -> None:
    """The under prompt is swapped for the baseline's: the model leaks its marker."""
    target = rig.targets["stale_kv"]
    baseline = await recalled_baseline(rig, target)
    assert baseline.verdict is Verdict.PASS, baseline.reason
    under = await rig.runner.run(target, ProbeKind.UNDER)
    assert under.verdict is Verdict.FOREIGN_MARKER, under.reason
    assert [f.probe_id for f in under.foreign] == [baseline.probe_id]
    assert under.reported_prompt_tokens == 1
    assert target.window == WINDOW  # discovered through the proxy's /props


async def test_stale_kv_serves_one_tenant_another_tenants_prefix_a_cross_tenant_leak(
    rig: Rig,
) -> None:
    """globex's under prompt is swapped for acme's baseline: the real model repeats acme's
    marker to globex, and kvwatch names both tenants."""
    target = rig.targets["stale_kv_tenants"]
    acme, globex = target.spec.tenants
    baseline = await recalled_baseline(rig, target)  # the default tenant: acme
    assert (baseline.verdict, baseline.tenant) == (Verdict.PASS, "acme"), baseline.reason
    under = await rig.runner.run(target, ProbeKind.UNDER, tenant=globex)
    assert under.verdict is Verdict.CROSS_TENANT_LEAK, under.reason
    assert under.tenant == "globex"
    assert [(f.probe_id, f.tenant) for f in under.foreign] == [(baseline.probe_id, acme.name)]
    assert under.reported_prompt_tokens == 1


async def test_truncate_head_drops_the_marker_and_is_caught_as_truncated(rig: Rig) -> None:
    """Only the last kv_pool tokens reach the model: fewer tokens read, no marker."""
    report = await rig.runner.run(rig.targets["truncate_head"], ProbeKind.UNDER)
    assert report.verdict is Verdict.TRUNCATED, report.reason
    assert not report.marker_found
    assert report.reported_prompt_tokens is not None
    assert abs(report.reported_prompt_tokens - POOL) <= 4


async def test_accept_over_limit_turns_the_real_400_into_a_200(rig: Rig) -> None:
    """The proxy retries the rejected prompt cut to fit: the real model answers it."""
    report = await rig.runner.run(rig.targets["accept_over_limit"], ProbeKind.OVER)
    assert report.verdict is Verdict.OVER_ACCEPTED, report.reason
    assert report.status == 200
    row = get_probe(rig.store, report.probe_id)
    assert row is not None and row.answer_excerpt  # a real answer, not an empty body


async def test_stream_error_frame_cuts_a_real_stream_after_its_first_token(rig: Rig) -> None:
    """200, the model's first content chunk, then an error frame: a stream error."""
    report = await rig.runner.run(rig.targets["stream_error_frame"], ProbeKind.UNDER)
    assert report.verdict is Verdict.STREAM_ERROR, report.reason
    assert report.status == 200


async def test_wrong_status_turns_the_real_context_error_into_a_500(rig: Rig) -> None:
    """llama.cpp's 400 exceed_context_size_error reaches kvwatch as a generic 500."""
    report = await rig.runner.run(rig.targets["wrong_status"], ProbeKind.OVER)
    assert report.verdict is Verdict.WRONG_REJECTION, report.reason
    assert report.status == 500
