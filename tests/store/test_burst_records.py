"""A burst probe's stored requests: controls round-trip, and rows stored before controls
existed read as they were."""

from __future__ import annotations

from kvwatch.canary.model import BurstOutcome, BurstRequest
from kvwatch.store.records import burst_from_json, burst_to_json

MARKER = "KVW-F1F1-F1F1-F1F1"


def test_a_control_round_trips_through_the_stored_json():
    """control=True is kept, and so is every other field of the request."""
    requests = (
        BurstRequest(1, 3, MARKER, "fox", BurstOutcome.WRONG, 200, False, "fox", answer="x"),
        BurstRequest(
            1, 1, MARKER, "fox", BurstOutcome.RIGHT, 200, True, "fox", answer="y", control=True
        ),
    )
    assert burst_from_json(burst_to_json(requests)) == requests


def test_a_request_stored_before_controls_existed_is_not_a_control():
    """An entry without the "control" key (kvwatch before controls) reads as a member."""
    stored = burst_to_json([BurstRequest(2, 3, MARKER, "fox", BurstOutcome.RIGHT)])
    del stored[0]["control"]
    (request,) = burst_from_json(stored)
    assert request.control is False
    assert request.index == 2
