"""UsageCalibratedCounter: estimates from characters, learns from reported usage."""

from __future__ import annotations

import httpx

from kvwatch.canary.markers import new_marker
from kvwatch.canary.model import Message
from kvwatch.engines.openai import OpenAIEngine
from kvwatch.simulator.server import run_simulator
from kvwatch.simulator.spec import SimEndpoint
from kvwatch.tokens.calibration import Calibration, Calibrations
from kvwatch.tokens.usage import CHARS_PER_TOKEN, UsageCalibratedCounter


def _prompt(chars: int) -> list[Message]:
    return [Message("user", "x" * chars)]


async def test_it_starts_at_four_characters_per_token() -> None:
    """Before any observation a prompt costs chars / 4 plus the template estimate."""
    counter = UsageCalibratedCounter()
    assert CHARS_PER_TOKEN == 4.0 and not counter.calibrations.calibrated
    assert await counter.count_prompt(_prompt(4000)) == 1000 + 3 + 4
    assert await counter.count_pieces(["abcd" * 10, "", "ab"]) == [10, 0, 1]
    assert counter.exact is False and counter.source == "usage"


async def test_one_observation_corrects_the_ratio_by_what_was_reported() -> None:
    """A prompt reported at twice the plan doubles the ratio, and the next plan is right."""
    counter = UsageCalibratedCounter()
    planned = await counter.count_prompt(_prompt(8000))  # 2000 + 7
    counter.observe(planned, 4014)  # the engine counts 2 chars per token
    assert counter.calibrations.at(4014).ratio == 2.0
    assert await counter.count_prompt(_prompt(8000)) == 4014


async def test_it_ignores_a_report_that_is_a_finding_not_a_calibration() -> None:
    """stale_kv reports 1 prompt token: learning from it would hide the next incident."""
    counter = UsageCalibratedCounter()
    planned = await counter.count_prompt(_prompt(40_000))
    counter.observe(planned, 1)
    counter.observe(planned, planned * 20)
    assert counter.calibrations == Calibrations()
    counter.observe(planned, planned)
    learnt = counter.calibrations
    counter.observe(planned, planned * 5)  # calibrated, the band is narrower
    assert counter.calibrations == learnt


async def test_it_inverts_a_plan_it_did_not_make() -> None:
    """An unknown planned size still corrects the ratio by reported/planned."""
    counter = UsageCalibratedCounter()
    counter.observe(1000, 1250)
    assert counter.calibrations.at(1250).ratio == 1.25


async def test_it_starts_from_a_stored_calibration() -> None:
    """A counter given a calibration plans with it from the first prompt."""
    stored = Calibrations(((9, Calibration(ratio=0.5, error=0.01, observations=3)),))
    counter = UsageCalibratedCounter(stored)
    assert await counter.count_prompt(_prompt(4000)) == round(1007 * 0.5)


async def test_it_converges_on_the_simulators_reported_usage() -> None:
    """Planning, probing and observing a few times brings the estimate within tolerance."""
    counter = UsageCalibratedCounter()
    words = " ".join(f"tide{i % 7} harbour quiet" for i in range(1500))
    drifts = []
    async with run_simulator([SimEndpoint("e", window=32_768)]) as sim, httpx.AsyncClient() as c:
        engine = OpenAIEngine(c, base_url=sim.url_for("e"), model="sim-1", api_key=None)
        for _ in range(4):
            messages = [Message("user", f"Code {new_marker()}. {words}")]
            planned = await counter.count_prompt(messages)
            ex = await engine.chat(messages, max_tokens=16, stream=False, timeout=30)
            assert ex.prompt_tokens is not None
            drifts.append(abs(ex.prompt_tokens - planned))
            counter.observe(planned, ex.prompt_tokens)
    assert drifts[0] > counter.tolerance(planned)
    assert drifts[-1] <= counter.tolerance(planned)
