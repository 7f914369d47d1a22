"""Tier weights follow from measured bandwidths, and the defaults are exactly that derivation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from strata.router.weights import DEFAULT_WEIGHTS, MEASURED, Measurements, TierWeights, derive


def test_weight_is_the_load_time_of_a_token_over_its_prefill_time():
    m = Measurements(
        kv_bytes_per_token=128 * 1024,
        prefill_tokens_per_s=10_000,
        read_gbps={"dram": 25.0, "nvme": 5.0, "shared": 1.0},
        source="t",
    )
    w = derive(m)
    assert w.hbm == 0.0
    assert w.dram == pytest.approx(128 * 1024 * 10_000 / 25e9, abs=1e-5)
    assert w.nvme == pytest.approx(5 * w.dram, rel=1e-3)
    assert w.shared > 1.0  # slower than recomputing on that hardware, and costed as such


def test_defaults_are_derived_from_the_recorded_measurements_and_ordered_by_tier():
    assert derive(MEASURED) == DEFAULT_WEIGHTS
    assert DEFAULT_WEIGHTS.hbm < DEFAULT_WEIGHTS.dram < DEFAULT_WEIGHTS.nvme < DEFAULT_WEIGHTS.shared < 1.0


def test_weights_are_validated():
    with pytest.raises(ValidationError, match="dram"):
        TierWeights(dram=-1, nvme=0.1, shared=0.2)
    with pytest.raises(ValidationError, match="extra"):
        TierWeights(dram=0.1, nvme=0.1, shared=0.2, tape=3)  # type: ignore[call-arg]
