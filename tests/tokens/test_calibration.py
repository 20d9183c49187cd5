"""Calibration: what the engine's own counts teach an estimate, and how far it is trusted."""

from __future__ import annotations

import pytest

from kvwatch.tokens.calibration import (
    ERROR_SPAN,
    LEARNING_RATE,
    MIN_RELATIVE_ERROR,
    MIN_TOLERANCE_TOKENS,
    SQRT_SPAN,
    UNCALIBRATED_ERROR,
    Calibration,
    Calibrations,
)


def test_an_uncalibrated_estimate_keeps_a_wide_tolerance() -> None:
    """Before any report the slack is the prior error, ERROR_SPAN times over."""
    blank = Calibration()
    assert not blank.calibrated
    assert blank.tolerance(10_000) == round(ERROR_SPAN * UNCALIBRATED_ERROR * 10_000)
    assert blank.tolerance(10) == MIN_TOLERANCE_TOKENS


def test_the_first_report_replaces_the_prior_guess() -> None:
    """One report sets the ratio to the engine's count over the raw estimate."""
    learnt = Calibration().learn(raw=1000, reported=1100)
    assert learnt.ratio == pytest.approx(1.1)
    assert learnt.observations == 1
    assert learnt.estimate(1000) == 1100
    assert learnt.tolerance(100_000) < Calibration().tolerance(100_000) / 5


def test_later_reports_move_the_ratio_part_way_and_track_the_miss() -> None:
    """A report 2 % off moves the ratio by the learning rate and raises the typical error."""
    settled = Calibration(ratio=1.0, error=MIN_RELATIVE_ERROR, observations=5)
    after = settled.learn(raw=10_000, reported=10_200)
    assert after.ratio == pytest.approx(1.0 + 0.02 * LEARNING_RATE)
    assert after.error > settled.error
    assert after.observations == 6


@pytest.mark.parametrize("reported", [0, -5, 1, 400, 25_000])
def test_a_report_far_from_the_estimate_teaches_nothing(reported: int) -> None:
    """A placeholder's 1 token or a wildly different count is a finding, not a calibration."""
    settled = Calibration(ratio=1.0, error=0.01, observations=3)
    assert settled.learn(raw=10_000, reported=reported) == settled


def test_a_drifting_engine_is_followed_within_a_few_reports() -> None:
    """After the engine's count moves 6 %, ten reports bring the estimate within 0.5 %."""
    calibration = Calibration().learn(raw=10_000, reported=10_400)
    for _ in range(10):
        calibration = calibration.learn(raw=10_000, reported=9_800)
    assert abs(calibration.estimate(10_000) - 9_800) / 9_800 < 0.005


def test_the_tolerance_never_falls_below_its_floor() -> None:
    """However good the record, a long prompt keeps ERROR_SPAN x the minimum relative error,
    and a short one a multiple of the square root of its size."""
    perfect = Calibration(ratio=1.0, error=0.0, observations=100)
    assert perfect.tolerance(1_000_000) == round(ERROR_SPAN * MIN_RELATIVE_ERROR * 1_000_000)
    assert perfect.tolerance(400) == round(SQRT_SPAN * 20)


@pytest.mark.parametrize(
    ("ratio", "error", "observations"), [(0.0, 0.1, 1), (1.0, 1.5, 1), (1.0, 0.1, -1)]
)
def test_an_impossible_calibration_is_refused(
    ratio: float, error: float, observations: int
) -> None:
    """A stored row that cannot be a calibration does not become one."""
    with pytest.raises(ValueError):
        Calibration(ratio=ratio, error=error, observations=observations)


def test_a_size_with_no_calibration_borrows_the_nearest_with_a_wider_error() -> None:
    """Learnt at ~1,500 tokens, an 8,192-token prompt uses that ratio with more slack; once
    its own octave reports, it uses its own."""
    short = Calibrations().learn(raw=1500, reported=1200)
    borrowed = short.at(8192)
    assert borrowed.ratio == pytest.approx(0.8)
    assert borrowed.error > short.at(1200).error
    both = short.learn(raw=10_000, reported=8300)
    assert both.at(8192).ratio == pytest.approx(0.83)
    assert both.at(1200).ratio == pytest.approx(0.8)
