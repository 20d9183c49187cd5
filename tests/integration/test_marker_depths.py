"""End to end against the simulator: truncate_head / truncate_tail at three depths are
localised, and every depth's evidence is stored (SQLite and PostgreSQL), served and shown.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from kvwatch.canary import markers
from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.cli import main
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from kvwatch.store.repository import Store
from kvwatch.web.app import WebContext, create_app
from tests.helpers.store import get_probe
from tests.helpers.targets import config_for, sim_endpoint_entry, targets_and_runner

UNDER, BASE = ProbeKind.UNDER, ProbeKind.BASELINE
DEPTHS = [0.0, 0.5, 1.0]
# The pool holds three quarters of the window: a cut keeps the 0.5 marker either way.
FLEET = [
    SimEndpoint("healthy", window=8192),
    SimEndpoint("head", window=8192, kv_pool=6144, fault=FaultMode.TRUNCATE_HEAD),
    SimEndpoint("tail", window=8192, kv_pool=6144, fault=FaultMode.TRUNCATE_TAIL),
    SimEndpoint(
        "head-lying", window=8192, kv_pool=6144, fault=FaultMode.TRUNCATE_HEAD, report_usage="sent"
    ),
    SimEndpoint("stale", window=8192, kv_pool=6144, fault=FaultMode.STALE_KV),
    SimEndpoint("weak", window=8192, fault=FaultMode.NO_RECALL),
]


@pytest.fixture
async def rig(store: Store) -> AsyncIterator[tuple]:
    async with run_simulator(FLEET) as sim, httpx.AsyncClient(timeout=None) as client:
        entries = [sim_endpoint_entry(sim, ep.name) for ep in FLEET]
        defaults = {"confirm": False, "max_tokens": 48, "marker_depths": DEPTHS}
        config = config_for(entries, database="sqlite:///unused.db", defaults=defaults)
        targets, runner, _metrics = targets_and_runner(config, store, client)
        yield targets, runner, store


@pytest.mark.parametrize(
    ("endpoint", "verdict", "outcomes", "where"),
    [
        ("healthy", Verdict.PASS, ["found", "found", "found"], None),
        (
            "head",
            Verdict.TRUNCATED,
            ["missing", "found", "found"],
            "head lost (markers at 0.0 missing; 0.5, 1.0 found): the engine kept the last ~6,",
        ),
        (
            "tail",
            Verdict.TRUNCATED,
            ["found", "found", "missing"],
            "tail lost (markers at 1.0 missing; 0.0, 0.5 found): the engine kept the first ~6,",
        ),
        (
            "head-lying",
            Verdict.MARKER_MISSING,
            ["missing", "found", "found"],
            "lacks 1 of 3 markers: head lost (markers at 0.0 missing; 0.5, 1.0 found)",
        ),
    ],
)
async def test_a_three_depth_under_probe_localises_the_simulated_cut(
    rig, endpoint, verdict, outcomes, where
):
    """truncate_head loses the 0.0 marker, truncate_tail the 1.0 one; stored per depth."""
    targets, runner, store = rig
    report = await runner.run(targets[endpoint], UNDER)
    assert report.verdict is verdict, report.reason
    assert [d.outcome.value for d in report.depths] == outcomes
    if where is not None:
        assert where in report.reason
    row = get_probe(store, report.probe_id)
    assert row is not None and row.reason == report.reason
    assert [(d.depth, d.outcome) for d in row.depths] == list(zip(DEPTHS, outcomes, strict=True))
    assert row.marker == row.depths[0].marker and row.marker_depth == 0.0


async def test_every_marker_of_a_probe_is_issued_so_a_leaked_deep_one_names_its_probe(rig):
    """Every code of a three-depth probe is issued (the deeper ones spelled as issued), and a
    stale engine that answers with them has each traced back; the victim's depths show
    foreign."""
    targets, runner, store = rig
    baseline = await runner.run(targets["stale"], BASE)
    assert baseline.verdict is Verdict.PASS, baseline.reason
    issued = get_probe(store, baseline.probe_id)
    assert issued is not None
    deep = [d.marker for d in issued.depths]
    found = store.lookup_markers([markers.canonical(m) for m in deep])
    assert {f.marker for f in found.values()} == set(deep)
    assert {f.probe_id for f in found.values()} == {baseline.probe_id}

    under = await runner.run(targets["stale"], UNDER)
    assert under.verdict is Verdict.FOREIGN_MARKER
    # Stale pages come back most recent first and may split a code at a page boundary, so
    # which of the three survive varies; each that does is traced to the baseline.
    assert under.foreign and {f.marker for f in under.foreign} <= set(deep)
    assert {f.probe_id for f in under.foreign} == {baseline.probe_id}
    assert [d.outcome.value for d in under.depths] == ["foreign"] * 3
    assert "; all lost (markers at 0.0, 0.5, 1.0 foreign)" in under.reason


async def test_a_weak_model_fails_the_baseline_with_the_same_depths_as_canary_ineffective(rig):
    """The short prompt carries a marker per depth too, so a weak recall is not an incident."""
    targets, runner, _store = rig
    report = await runner.run(targets["weak"], BASE)
    assert report.verdict is Verdict.CANARY_INEFFECTIVE
    assert len(report.depths) == 3


async def test_the_api_and_cli_serve_each_depth_with_what_was_lost(rig, db_url, tmp_path):
    """/api/v1/probes/ID lists depths and `lost`; `kvwatch show` and `results` say it too."""
    targets, runner, store = rig
    report = await runner.run(targets["tail"], UNDER)
    app = create_app(WebContext(store=store, registry=CollectorRegistry(), alive=lambda: True))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://kvwatch"
    ) as client:
        body = (await client.get(f"/api/v1/probes/{report.probe_id}")).json()
        page = (await client.get(f"/probes/{report.probe_id}")).text
    assert body["lost"] == "tail"
    assert [(d["depth"], d["outcome"]) for d in body["depths"]] == [
        (0.0, "found"),
        (0.5, "found"),
        (1.0, "missing"),
    ]
    assert 'data-outcome="missing"' in page and "tail lost (markers at 1.0 missing" in page

    config = tmp_path / "kvwatch.yaml"
    config.write_text(
        f"database: '{db_url}'\nendpoints:\n  - name: tail\n    url: http://127.0.0.1:9/v1\n"
        "    model: m\n"
    )
    shown = CliRunner().invoke(main, ["show", "--config", str(config), str(report.probe_id)])
    assert shown.exit_code == 0, shown.output
    assert f"  at depth 1.0    {body['depths'][2]['marker']} MISSING" in shown.stdout
    assert "  lost:          tail" in shown.stdout
    listed = CliRunner().invoke(main, ["results", "--config", str(config), "--output", "csv"])
    assert listed.exit_code == 0 and ",tail," in listed.stdout.splitlines()[1]
