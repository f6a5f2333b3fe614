"""Drift statistics: total variation, surprise z-scores, CUSUM's false-alarm rate."""

from __future__ import annotations

import numpy as np
import pytest

from fednovelty.mixture.drift import (
    cusum_arl0,
    cusum_step,
    cusum_threshold,
    standardized_surprise,
    total_variation,
)


def test_total_variation_over_the_last_axis():
    p = np.array([[0.2, 0.8], [0.5, 0.5]])
    q = np.array([[0.2, 0.8], [0.0, 1.0]])
    np.testing.assert_allclose(total_variation(p, q), [0.0, 0.5])
    with pytest.raises(ValueError, match="same shape"):
        total_variation([0.5, 0.5], [1.0, 0.0, 0.0])


def test_surprise_is_a_z_score_of_the_window_mean():
    assert standardized_surprise(-12.0, 100, ref_mean=-10.0, ref_sd=5.0) == pytest.approx(4.0)
    assert standardized_surprise(-8.0, 25, ref_mean=-10.0, ref_sd=5.0) == pytest.approx(-2.0)
    assert standardized_surprise(-8.0, 0, ref_mean=-10.0, ref_sd=5.0) == 0.0
    with pytest.raises(ValueError, match="ref_sd"):
        standardized_surprise(-8.0, 3, ref_mean=-10.0, ref_sd=0.0)


def test_cusum_alarms_and_restarts():
    statistic, alarm = cusum_step(0.0, 2.0, k=0.5, h=3.0)
    assert (statistic, alarm) == (1.5, False)
    statistic, alarm = cusum_step(statistic, 2.5, k=0.5, h=3.0)
    assert (statistic, alarm) == (0.0, True)
    assert cusum_step(0.2, -3.0, k=0.5, h=3.0) == (0.0, False)


@pytest.mark.parametrize("rate", [0.01, 0.05])
def test_threshold_gives_the_documented_false_alarm_rate_on_a_stationary_stream(rate):
    h = cusum_threshold(rate)
    assert cusum_arl0(h) == pytest.approx(1.0 / rate, rel=1e-6)
    z = np.random.default_rng(0).standard_normal(200_000)
    statistic, alarms = 0.0, 0
    for value in z:
        statistic, alarm = cusum_step(statistic, float(value), 0.5, h)
        alarms += alarm
    # Siegmund's approximation: within 15 % of the empirical rate (200,000 windows)
    assert alarms / z.size == pytest.approx(rate, rel=0.15)


def test_threshold_errors_are_named():
    with pytest.raises(ValueError, match="false_alarm_rate"):
        cusum_threshold(0.0)
    with pytest.raises(ValueError, match="k must be > 0"):
        cusum_arl0(2.0, k=0.0)
