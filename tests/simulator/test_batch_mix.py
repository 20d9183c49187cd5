"""The simulator's batch path: requests in flight, and a batch that mixes their answers."""

from __future__ import annotations

import pytest

from kvwatch.simulator import tokenizer
from kvwatch.simulator.model import Answer, EndpointState, mix_batch, recall
from kvwatch.simulator.spec import FaultMode, SimEndpoint

MARKERS = ("KVW-AAAA-AAAA-AAAA", "KVW-BBBB-BBBB-BBBB", "KVW-CCCC-CCCC-CCCC")
WORDS = ("owl", "fox", "yak")


def _answers() -> list[Answer]:
    return [
        Answer(tuple(tokenizer.tokenize(f"{m} {w}")), "stop", 10 + i, 10 + i, None)
        for i, (m, w) in enumerate(zip(MARKERS, WORDS, strict=True))
    ]


def test_the_model_gives_back_the_planted_word_after_the_code():
    """A burst prompt's code and animal come back, in that order."""
    prompt = f"Remember this code: {MARKERS[0]}. Remember this animal: owl. ... the animal."
    assert recall(prompt) == f"{MARKERS[0]} owl"
    assert recall(prompt, can_recall=False) == "I could not find a code in the text."


def test_a_batch_below_the_threshold_keeps_every_answer():
    """Fewer requests in flight than batch_mix_at: each its own answer."""
    batch = _answers()
    assert [mix_batch(batch, i, at=4, how="swap") for i in range(3)] == batch


def test_a_swapping_batch_answers_each_request_with_the_next_ones_answer():
    """swap: request i gets request i+1's text (the last wraps to the first), its own usage."""
    batch = _answers()
    mixed = [mix_batch(batch, i, at=3, how="swap") for i in range(3)]
    assert [m.text for m in mixed] == [
        f"{MARKERS[1]} fox",
        f"{MARKERS[2]} yak",
        f"{MARKERS[0]} owl",
    ]
    assert [m.prompt_tokens for m in mixed] == [10, 11, 12]


def test_a_mixing_batch_keeps_each_marker_with_the_next_ones_word():
    """mix: request i keeps its marker and ends with request i+1's word."""
    batch = _answers()
    mixed = [mix_batch(batch, i, at=3, how="mix").text for i in range(3)]
    assert mixed == [f"{MARKERS[0]} fox", f"{MARKERS[1]} yak", f"{MARKERS[2]} owl"]


def test_the_endpoint_counts_its_requests_in_flight_and_mixes_only_with_the_fault():
    """arrive/leave keep the running batch; batched() mixes only under batch_mix."""
    state = EndpointState(SimEndpoint("e", fault=FaultMode.BATCH_MIX, batch_mix_at=3))
    flights = [state.arrive(a) for a in _answers()]
    assert state.stats.peak_in_flight == 3
    assert state.batched(flights[0]).text == f"{MARKERS[1]} fox"
    state.fault = FaultMode.HEALTHY
    assert state.batched(flights[0]).text == f"{MARKERS[0]} owl"
    for flight in flights:
        state.leave(flight)
    assert state.in_flight == [] and state.stats.peak_in_flight == 3


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("batch_mix_at", 1, "batch_mix_at must be at least 2"), ("batch_mix_how", "blend", "swap")],
)
def test_bad_batch_mix_settings_are_refused(field, value, message):
    """A threshold under 2 or an unknown way to mix is an error naming it."""
    with pytest.raises(ValueError, match=message):
        SimEndpoint("e", **{field: value})
