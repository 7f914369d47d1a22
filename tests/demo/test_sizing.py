"""The scaling act's load, sized from a measured replica (pure)."""

from __future__ import annotations

import pytest

from strata.demo.sizing import MAX_SHARE, PROBE_SHARE, Band, Measured, SizingError, size

# premium: target 0.2, tolerance 0.1; batch: target 0.7, tolerance 0.15 (the chart's tiers)
CHART = Band.of(0.2, 0.1, 0.7, 0.15)


def test_the_band_is_the_tiers_targets_widened_by_their_tolerances() -> None:
    assert CHART.low == pytest.approx(0.22) and CHART.high == pytest.approx(0.805)
    assert CHART.low < CHART.aim < CHART.high


def test_the_rate_puts_one_replica_in_the_middle_of_the_band_whatever_the_machine() -> None:
    quiet, loaded = Measured(20.0, 0.3), Measured(5.0, 0.3)  # a busy machine: a quarter of the rate
    for measured in (quiet, loaded):
        sizing = size(measured, CHART)
        assert sizing.expected_utilization == pytest.approx(CHART.aim)
        assert sizing.share == pytest.approx(CHART.aim / 0.3 * PROBE_SHARE)
        assert sizing.rate_per_s == pytest.approx(measured.requests_per_s * sizing.share)


def test_a_replica_that_computes_prompts_little_of_its_time_gets_at_most_the_max_share() -> None:
    sizing = size(Measured(10.0, 0.175), CHART)
    assert sizing.share == MAX_SHARE and sizing.expected_utilization == pytest.approx(0.28)


def test_sizes_that_cannot_work_say_why() -> None:
    with pytest.raises(SizingError, match=r"computed prompts only 0\.10 of the time"):
        size(Measured(10.0, 0.1), CHART)
    with pytest.raises(SizingError, match="completed no request"):
        size(Measured(0.0, 0.3), CHART)
    with pytest.raises(SizingError, match="is not under batch's"):
        size(Measured(10.0, 0.3), Band.of(0.7, 0.1, 0.2, 0.1))
