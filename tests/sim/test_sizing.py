"""Sizing the static baselines: bisection to the smallest count within tolerance of the best,
the busiest window, and the mean scaled from the peak."""

from __future__ import annotations

import pytest

from strata.sim.sizing import busiest, mean_replicas, smallest, token_rates
from tests.sim.helpers import trace


def test_smallest_finds_the_knee_with_few_evaluations():
    calls: list[int] = []

    def attainment(n: int) -> float:
        calls.append(n)
        return min(1.0, n / 10)

    assert smallest(attainment, 1, 64) == 10
    assert len(calls) <= 8


def test_the_busiest_window_and_the_mean_over_peak_ratio():
    # 60 s windows: 1,000 tokens in minute 0, 4,000 in minute 2, 1,000 in minute 3.
    t = trace((10.0, 1000, 1, (1,) * 10), (130.0, 4000, 1, (2,) * 40), (190.0, 1000, 1, (3,) * 10))
    assert token_rates(t)[2] * 60 == pytest.approx(4000)
    assert busiest(t, 60.0) == 120.0
    # Full windows (the last is partial): 1,000, 0, 4,000 tokens: mean / peak = 5 / 12.
    assert mean_replicas(t, 12) == 5
