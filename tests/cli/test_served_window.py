"""`kvwatch probe` measures the served window after a window failure; `kvwatch served-window`
reads it back."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from click.testing import CliRunner

from kvwatch.cli import main
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint

HEAD = SimEndpoint("head", window=16_384, kv_pool=6_144, fault=FaultMode.TRUNCATE_HEAD)


async def _cli(*args: str) -> tuple[int, str]:
    # The CLI runs its own event loop: off this one, which serves the simulator.
    result = await asyncio.to_thread(CliRunner().invoke, main, list(args))
    return result.exit_code, result.stdout


async def test_probe_prints_the_bisect_steps_and_the_served_window(
    tmp_path: Path, db_url: str
) -> None:
    """A truncating endpoint: the under probe fails, two bisect steps follow, and the table
    ends with "advertised … · served …"; served-window lists the stored measurement."""
    async with run_simulator([HEAD]) as sim:
        config = tmp_path / "kvwatch.yaml"
        config.write_text(
            f"database: '{db_url}'\n"
            "endpoints:\n"
            "  - name: head\n"
            f"    url: {sim.url_for('head')}\n"
            "    model: sim-1\n"
            "    context_window: 16384\n"
            "    probes: [baseline, under]\n"
        )
        code, out = await _cli("probe", "head", "--config", str(config))
        assert code == 1
        assert out.count("bisect (after") == 2
        assert out.rstrip().endswith(
            "Served window: advertised 16,384 · served 6,144 (largest prompt served whole, "
            "to the token; 2 bisect probes)."
        )
        code, out = await _cli("served-window", "--config", str(config), "--output", "json")
        assert code == 0
        (row,) = [json.loads(line) for line in out.splitlines()]
        assert (row["endpoint"], row["served_tokens"], row["exact"]) == ("head", 6_144, True)
        code, out = await _cli("served-window", "head", "--config", str(config))
        assert code == 0 and "16,384" in out and "6,144" in out and "search" in out


STALE = SimEndpoint("stale", window=8_192, kv_pool=3_000, fault=FaultMode.STALE_KV)


async def test_probe_json_prints_every_probe_it_stored_the_bisect_steps_included(
    tmp_path: Path, db_url: str
) -> None:
    """The incident's signature (prompt_tokens 1, no baseline yet): one object per stored
    probe, under and confirmation and every bisect step, none of them an error, and the
    served window stored no larger than the pool."""
    async with run_simulator([STALE]) as sim:
        config = tmp_path / "kvwatch.yaml"
        config.write_text(
            f"database: '{db_url}'\n"
            "endpoints:\n"
            "  - name: stale\n"
            f"    url: {sim.url_for('stale')}\n"
            "    model: sim-1\n"
            "    context_window: 8192\n"
        )
        code, out = await _cli(
            "probe", "stale", "--kind", "under", "--output", "json", "--config", str(config)
        )
        assert code == 1
        printed = [json.loads(line) for line in out.splitlines()]
        # stdout holds probes only: a warning logged meanwhile goes to stderr.
        assert all({"endpoint", "kind", "verdict", "probe_id"} <= p.keys() for p in printed)
        code, out = await _cli("results", "--output", "json", "--config", str(config))
        stored = [json.loads(line) for line in out.splitlines()]
        assert sorted(p["probe_id"] for p in printed) == sorted(r["id"] for r in stored)
        assert [p["kind"] for p in printed][:2] == ["under", "under"]
        steps = [p for p in printed if p["kind"] == "bisect"]
        assert steps and all(p["trigger_probe_id"] == printed[1]["probe_id"] for p in steps)
        assert "error" not in [p["verdict"] for p in steps]
        code, out = await _cli("served-window", "--config", str(config), "--output", "json")
        (row,) = [json.loads(line) for line in out.splitlines()]
        assert row["served_tokens"] <= 3_000 < row["unserved_tokens"]


def test_bisect_is_not_a_kind_probe_accepts() -> None:
    """Search steps only run after a failure: `--kind bisect` is refused."""
    result = CliRunner().invoke(main, ["probe", "x", "--kind", "bisect"])
    assert result.exit_code == 2 and "bisect" in result.stderr
