"""Ollama truncates instead of refusing (issue 13): its over probe shows the cut, never pages.

The daemon's own wiring (``kvwatch.daemon.build``: runner, metrics, alert evaluator and the
store, SQLite) against the simulator's Ollama, which cuts a prompt over its window to the
window as Ollama's runner does. No Alertmanager is needed: the alert states are stored.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.daemon import Built, build
from kvwatch.simulator.server import RunningSimulator, run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from tests.helpers.counters import SimCounter
from tests.helpers.targets import config_for, sim_endpoint_entry

UNDER, OVER, BASE = ProbeKind.UNDER, ProbeKind.OVER, ProbeKind.BASELINE
WINDOW = 4096


@contextlib.asynccontextmanager
async def ollama(
    tmp_path: Path, *, kv_pool: int | None = None, counter: SimCounter | None = None
) -> AsyncIterator[tuple[RunningSimulator, Built]]:
    """A simulated Ollama and kvwatch's objects probing it (confirmation on, as shipped)."""
    endpoint = SimEndpoint("ol", window=WINDOW, flavour="ollama", kv_pool=kv_pool)
    async with run_simulator([endpoint]) as sim:
        entry = sim_endpoint_entry(sim, "ol", flavour="ollama")
        config = config_for([entry], database=f"sqlite:///{tmp_path / 'kvwatch.db'}")
        built = await build(config)
        # Ollama has no tokenize endpoint: count locally with the simulator's tokenizer, as
        # a configured hf: tokenizer does on a real deployment.
        built.targets[0] = dataclasses.replace(built.targets[0], counter=counter or SimCounter())
        try:
            yield sim, built
        finally:
            await built.clients.aclose()
            built.store.engine.dispose()


async def probe(built: Built, kind: ProbeKind) -> list[Verdict]:
    return [r.verdict for r in await built.runner.run_checked(built.targets[0], kind)]


def raised(built: Built) -> dict[str, str]:
    """Alert name → state, for every alert that is not inactive."""
    return {s.alertname: s.state for s in built.store.load_alert_states() if s.state != "inactive"}


@pytest.mark.parametrize(
    "counter",
    [SimCounter(), SimCounter(exact=False, skew=0.005), SimCounter(exact=False, skew=-0.005)],
    ids=["exact", "estimate-high", "estimate-low"],
)
async def test_a_healthy_ollama_gets_over_truncated_and_no_alert(
    tmp_path: Path, counter: SimCounter
) -> None:
    """Cycles of baseline, under and over: over is over_truncated (no confirmation probe),
    the success gauge stays 1, and no alert is ever raised, with an exact or estimated count."""
    async with ollama(tmp_path, counter=counter) as (_sim, kv):
        for _ in range(3):
            assert await probe(kv, BASE) == [Verdict.PASS]
            assert await probe(kv, UNDER) == [Verdict.PASS]
            assert await probe(kv, OVER) == [Verdict.OVER_TRUNCATED]
        over = kv.store.list_probes()[0]
        assert over.kind == "over" and over.reported_prompt_tokens == WINDOW
        assert over.planned_prompt_tokens > WINDOW
        labels = {"endpoint": "ol", "probe": "over"}
        assert kv.registry.get_sample_value("kvwatch_probe_success", labels) == 1.0
        assert raised(kv) == {}


async def test_an_ollama_that_reads_past_its_window_still_pages_and_recovers(
    tmp_path: Path,
) -> None:
    """An over prompt read whole is confirmed over_accepted and fires LimitNotEnforced; two
    healthy cuts in a row resolve it."""
    async with ollama(tmp_path) as (sim, kv):
        assert await probe(kv, BASE) == [Verdict.PASS]
        sim.set_fault("ol", FaultMode.ACCEPT_OVER_LIMIT)
        assert await probe(kv, OVER) == [Verdict.OVER_ACCEPTED, Verdict.OVER_ACCEPTED]
        assert raised(kv) == {"KVWatchLimitNotEnforced": "firing"}

        sim.set_fault("ol", FaultMode.HEALTHY)
        for _ in range(2):
            assert await probe(kv, OVER) == [Verdict.OVER_TRUNCATED]
        assert raised(kv) == {"KVWatchLimitNotEnforced": "resolved"}


async def test_an_ollama_answering_from_stale_cache_pages(tmp_path: Path) -> None:
    """Truncation by design excuses only the over probe: stale KV pages on under still page."""
    async with ollama(tmp_path, kv_pool=WINDOW // 2) as (sim, kv):
        assert await probe(kv, BASE) == [Verdict.PASS]
        sim.set_fault("ol", FaultMode.STALE_KV)
        reports = await kv.runner.run_checked(kv.targets[0], UNDER)
        verdicts = [r.verdict for r in reports if r.kind is UNDER]
        assert verdicts[0] in {Verdict.FOREIGN_MARKER, Verdict.TRUNCATED}
        assert len(verdicts) == 2  # critical: confirmed at once (then the served-window search)
        assert set(raised(kv)) <= {"KVWatchCrossRequestLeak", "KVWatchContextNotHonored"}
        assert "firing" in raised(kv).values()


class RecordingCounter(SimCounter):
    """A SimCounter that keeps what the runner asked it to learn from."""

    def __init__(self) -> None:
        super().__init__(exact=False)
        self.observed: list[tuple[int, int]] = []

    def observe(self, planned: int, reported: int) -> None:
        self.observed.append((planned, reported))


async def test_a_cut_over_prompt_is_not_learnt_as_the_prompts_size(tmp_path: Path) -> None:
    """The window an over prompt was cut to says nothing of the prompt's size: calibrating
    on it would make every later canary too long. Under and baseline still calibrate."""
    counter = RecordingCounter()
    async with ollama(tmp_path, counter=counter) as (_sim, kv):
        assert await probe(kv, BASE) == [Verdict.PASS]
        assert await probe(kv, OVER) == [Verdict.OVER_TRUNCATED]
    [(_planned, reported)] = counter.observed
    assert reported < WINDOW // 2  # the baseline's, not the over probe's window-sized count
