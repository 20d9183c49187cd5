"""Calibration: what the engine's own counts teach an estimate, and how far it is trusted."""

from __future__ import annotations

import pytest

from kvwatch.tokens.calibration import (
    MIN_RELATIVE_ERROR,
    MIN_TOLERANCE_TOKENS,
    UNCALIBRATED_ERROR,
    Calibration,
)


def test_an_uncalibrated_estimate_keeps_a_wide_tolerance() -> None:
    """Before any report the slack is the prior error, three times over."""
    blank = Calibration()
    assert not blank.calibrated
    assert blank.tolerance(10_000) == round(3 * UNCALIBRATED_ERROR * 10_000)
    assert blank.tolerance(10) == MIN_TOLERANCE_TOKENS


def test_the_first_report_replaces_the_prior_guess() -> None:
    """One report sets the ratio to the engine's count over the raw estimate."""
    learnt = Calibration().learn(raw=1000, reported=1100)
    assert learnt.ratio == pytest.approx(1.1)
    assert learnt.observations == 1
    assert learnt.estimate(1000) == 1100
    assert learnt.tolerance(100_000) < Calibration().tolerance(100_000) / 5


def test_later_reports_move_the_ratio_half_way_and_track_the_miss() -> None:
    """A report 2 % off moves the ratio half way and raises the typical error."""
    settled = Calibration(ratio=1.0, error=MIN_RELATIVE_ERROR, observations=5)
    after = settled.learn(raw=10_000, reported=10_200)
    assert after.ratio == pytest.approx(1.01)
    assert after.error > settled.error
    assert after.observations == 6


@pytest.mark.parametrize("reported", [0, -5, 1, 400, 25_000])
def test_a_report_far_from_the_estimate_teaches_nothing(reported: int) -> None:
    """A placeholder's 1 token or a wildly different count is a finding, not a calibration."""
    settled = Calibration(ratio=1.0, error=0.01, observations=3)
    assert settled.learn(raw=10_000, reported=reported) == settled


def test_a_drifting_engine_is_followed_within_a_few_reports() -> None:
    """After the engine's count moves 6 %, five reports bring the estimate within 0.5 %."""
    calibration = Calibration().learn(raw=10_000, reported=10_400)
    for _ in range(5):
        calibration = calibration.learn(raw=10_000, reported=9_800)
    assert abs(calibration.estimate(10_000) - 9_800) / 9_800 < 0.005


def test_the_tolerance_never_falls_below_its_floor() -> None:
    """However good the record, a long prompt keeps 3 x the minimum relative error."""
    perfect = Calibration(ratio=1.0, error=0.0, observations=100)
    assert perfect.tolerance(1_000_000) == round(3 * MIN_RELATIVE_ERROR * 1_000_000)


@pytest.mark.parametrize(
    ("ratio", "error", "observations"), [(0.0, 0.1, 1), (1.0, 1.5, 1), (1.0, 0.1, -1)]
)
def test_an_impossible_calibration_is_refused(ratio: float, error: float, observations: int) -> None:
    """A stored row that cannot be a calibration does not become one."""
    with pytest.raises(ValueError):
        Calibration(ratio=ratio, error=error, observations=observations)
