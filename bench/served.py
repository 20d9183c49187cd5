"""Served-window benchmark: what finding the true served window costs, kvwatch vs bisection.

An endpoint advertises 1,048,576 tokens but keeps prompts whole only up to its KV pool (the
simulator's ``truncate_head`` fault: beyond the pool it drops the head and reports the tokens
it read). For served limits of 4,096 / 131,072 / 681,280, a real runner (simulator over
loopback HTTP, server tokenizer, SQLite store) runs the baseline, then the failing under
probe, then the search twice:

- *kvwatch*: the engine's signal first (the truncated answer's prompt tokens), verified by
  two probes, bisection only as a fallback;
- *plain bisection*: the same bisect probes and the same stopping rule (1,024 tokens), with
  every signal ignored.

Reported per search: probes, prefilled tokens (the simulator's own count of what it
processed, failed probes included) and what was concluded. A second table does the same
for the ``window_not_served`` fault (a 4xx naming the limit: rejected prompts prefill nothing,
and the largest prompt served is the pool minus the answer's ``max_tokens``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from pathlib import Path

import httpx

from bench.machine import describe
from kvwatch import logs
from kvwatch.canary import served
from kvwatch.canary.model import ProbeKind, Verdict
from kvwatch.probe.model import ProbeReport, Target
from kvwatch.probe.runner import ProbeRunner
from kvwatch.probe.served import ServedWindowTracker, hint_of
from kvwatch.simulator.server import RunningSimulator, run_simulator
from kvwatch.simulator.spec import FaultMode, SimEndpoint
from kvwatch.store.engine import create_engine_for
from kvwatch.store.migrate import upgrade_engine
from kvwatch.store.repository import Store
from tests.helpers.targets import config_for, sim_endpoint_entry, targets_and_runner

WINDOW = 1_048_576
LIMITS = (4_096, 131_072, 681_280)


@dataclasses.dataclass(frozen=True)
class Cost:
    probes: int
    prefilled: int
    served: int
    unserved: int
    exact: bool


def _prefilled(sim: RunningSimulator, name: str) -> int:
    return int(sim.stats()[name]["prefilled_tokens"])


async def _plain_bisection(
    runner: ProbeRunner, target: Target, trigger: ProbeReport, low: int
) -> served.ServedSearch:
    """The same search loop with no hints: bisection to the same resolution."""
    assert trigger.planned_prompt_tokens is not None and target.window is not None
    state = served.start(served=low, unserved=trigger.planned_prompt_tokens, window=target.window)
    while (size := served.next_size(state)) is not None:
        report = await runner.run(target, ProbeKind.BISECT, size=size, trigger=trigger.probe_id)
        assert report.planned_prompt_tokens is not None
        state = served.observe(
            state,
            served.Observation(
                size=report.planned_prompt_tokens, whole=report.verdict is Verdict.PASS
            ),
        )
    return state


async def _measure(fault: FaultMode, limit: int, store: Store) -> tuple[Cost, Cost]:
    name = f"{fault.value.replace('_', '-')}-{limit}"
    endpoint = SimEndpoint(name, window=WINDOW, kv_pool=limit, fault=fault)
    async with run_simulator([endpoint]) as sim, httpx.AsyncClient(timeout=None) as client:
        config = config_for(
            [sim_endpoint_entry(sim, name)],
            database="sqlite:///unused.db",
            defaults={"confirm": False},
        )
        targets, runner, _ = targets_and_runner(config, store, client)
        target = targets[name]
        baseline = await runner.run(target, ProbeKind.BASELINE)
        assert baseline.verdict is Verdict.PASS and baseline.planned_prompt_tokens
        trigger = await runner.run(target, ProbeKind.UNDER)
        assert trigger.verdict is not Verdict.PASS, trigger.reason
        tracker = ServedWindowTracker(store, runner.clock)

        before = _prefilled(sim, name)

        async def bisect(size: int, trigger_id: int | None) -> ProbeReport:
            return await runner.run(target, ProbeKind.BISECT, size=size, trigger=trigger_id)

        found = (await tracker.search(bisect, target, trigger)).record
        assert found is not None
        ours = Cost(
            probes=found.probes,
            prefilled=_prefilled(sim, name) - before,
            served=found.served_tokens,
            unserved=found.unserved_tokens or 0,
            exact=found.exact,
        )
        assert hint_of(trigger, target) is not None  # the signal the plain search ignores

        before = _prefilled(sim, name)
        state = await _plain_bisection(runner, target, trigger, baseline.planned_prompt_tokens)
        plain = Cost(
            probes=state.spent,
            prefilled=_prefilled(sim, name) - before,
            served=state.served,
            unserved=state.unserved,
            exact=state.exact,
        )
        return ours, plain


def _found(c: Cost) -> str:
    return f"{c.served:,} (exact)" if c.exact else f"{c.served:,}..{c.unserved - 1:,}"


async def run(faults: tuple[FaultMode, ...]) -> None:
    logs.configure("warning")  # the table, not a probe line per step
    print(f"# served-window benchmark — {describe()}")
    print(
        f"# advertised window {WINDOW:,}; budget {served.probe_budget(WINDOW)} probes; "
        f"bisection resolution {served.RESOLUTION:,} tokens"
    )
    print(
        "| fault | served limit | kvwatch probes | kvwatch prefilled | kvwatch found "
        "| bisection probes | bisection prefilled | bisection found |"
    )
    print("|---|---:|---:|---:|---|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        engine = create_engine_for(f"sqlite:///{Path(tmp) / 'bench.db'}")
        upgrade_engine(engine)
        store = Store(engine)
        try:
            for fault in faults:
                for limit in LIMITS:
                    ours, plain = await _measure(fault, limit, store)
                    print(
                        f"| {fault.value} | {limit:,} | {ours.probes} | {ours.prefilled:,} | "
                        f"{_found(ours)} | {plain.probes} | {plain.prefilled:,} | {_found(plain)} |"
                    )
        finally:
            engine.dispose()


def main() -> None:
    asyncio.run(run((FaultMode.TRUNCATE_HEAD, FaultMode.WINDOW_NOT_SERVED)))


if __name__ == "__main__":
    main()
