"""Fitting step costs recovers the costs that generated the measurements."""

from __future__ import annotations

import pytest

from strata.sim.calibrate import Decode, Prefill, fit
from strata.sim.profile import Profile, ReadBandwidth

TRUE = Profile(
    name="t",
    kv_bytes_per_token=1,
    kv_cache_bytes=1,
    max_batched_tokens=2048,
    max_num_seqs=64,
    overhead_s=0.004,
    floor_s=0.0,
    prefill_token_s=2e-4,
    attention_pair_s=1e-8,
    decode_seq_s=0.001,
    decode_context_token_s=3e-7,
    read_gbps=ReadBandwidth(dram=1, nvme=1, shared=1),
    startup_s=1,
)


def test_fit_recovers_the_generating_costs():
    decodes = [Decode(b, c, TRUE.step_s(0, b, b * c)) for b in (1, 4, 16) for c in (256, 2048)]
    prefills = [Prefill(n, TRUE.lone_prefill_s(n)) for n in (256, 1024, 2048, 4096)]
    costs = fit(decodes, prefills, TRUE.max_batched_tokens)
    assert costs.overhead_s == pytest.approx(0.004)
    assert costs.decode_seq_s == pytest.approx(0.001)
    assert costs.decode_context_token_s == pytest.approx(3e-7)
    assert costs.prefill_token_s == pytest.approx(2e-4)
    assert costs.attention_pair_s == pytest.approx(1e-8)


def test_fit_separates_the_cost_outside_the_engine_and_holds_noise_at_zero():
    client = TRUE.model_copy(update={"request_overhead_s": 0.03})
    decodes = [Decode(b, c, TRUE.step_s(0, b, b * c)) for b in (1, 4, 16) for c in (256, 2048)]
    prefills = [Prefill(n, client.lone_prefill_s(n) + 0.03) for n in (64, 256, 1024, 2048, 4096)]
    costs = fit(decodes, prefills, TRUE.max_batched_tokens)
    assert costs.request_overhead_s == pytest.approx(0.03)
    assert costs.prefill_token_s == pytest.approx(2e-4)
    # Prefill times that fall with length beyond a point (a burst on a busy machine under the
    # short ones): the pair cost would be negative, and is held at zero.
    noisy = [Prefill(256, 0.09), Prefill(1024, 0.25), Prefill(2048, 0.45), Prefill(4096, 0.8)]
    held = fit(decodes, noisy, TRUE.max_batched_tokens)
    assert held.attention_pair_s == 0 and held.prefill_token_s > 0 and held.request_overhead_s >= 0
    with pytest.raises(ValueError, match="no cost per token"):
        fit(decodes, [Prefill(256, 0.5), Prefill(1024, 0.3), Prefill(4096, 0.1)], TRUE.max_batched_tokens)


def test_too_few_measurements_are_refused():
    with pytest.raises(ValueError, match="at least 3 decode"):
        fit([Decode(1, 1, 0.01)], [Prefill(1, 0.1)], 16)
