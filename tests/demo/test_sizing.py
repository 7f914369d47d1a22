"""The scaling act's load and premium's target for it, from a measured replica (pure)."""

from __future__ import annotations

import pytest

from strata.demo.sizing import HEADROOM, LOAD_SHARE, Measured, SizingError, size

BATCH = 0.7 * 1.15  # the chart's batch tier: target 0.7, tolerance 0.15


def test_the_rate_is_a_share_of_the_throughput_and_premium_is_headroom_times_under_the_load() -> None:
    quiet, loaded = Measured(16.0, 0.12), Measured(5.0, 0.28)  # two-core machine, quiet and at load 20
    for measured in (quiet, loaded):
        sizing = size(measured, BATCH)
        assert sizing.rate_per_s == pytest.approx(LOAD_SHARE * measured.requests_per_s)
        assert measured.utilization / sizing.premium_target == pytest.approx(HEADROOM, rel=0.02)
        # two replicas share the load and stay over the target: the act's scale-up holds
        assert measured.utilization / 2 > sizing.premium_target * 1.1
    assert size(quiet, BATCH).premium_target == 0.04


def test_sizes_that_cannot_work_say_why() -> None:
    with pytest.raises(SizingError, match=r"computed prompts 0\.010 of the time: too little"):
        size(Measured(10.0, 0.01), BATCH)
    with pytest.raises(SizingError, match=r"batch \(threshold 0\.80\) could scale too"):
        size(Measured(10.0, 0.5), BATCH)
    with pytest.raises(SizingError, match="completed no request"):
        size(Measured(0.0, 0.3), BATCH)
