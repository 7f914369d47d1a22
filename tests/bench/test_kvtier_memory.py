"""The sidecar memory benchmark's plumbing: a fresh interpreter fills both lower tiers through the
real put path, another a DRAM tier, others restart on them, and the figures are per block held
(their size is the benchmark's to report)."""

from __future__ import annotations

from bench import kvtier_memory
from strata.common.kvbudget import INDEX_BYTES_PER_BLOCK


def test_the_memory_bench_fills_both_lower_tiers_and_reports_per_block():
    policies = (kvtier_memory.PREMIUM, kvtier_memory.Policy("lru", 60.0))
    result = kvtier_memory.run(blocks=640, policies=policies)
    assert result["blocks_per_tier"] == 640 and result["tiers"] == ["nvme", "shared"]
    assert result["estimate_bytes_per_block"] == INDEX_BYTES_PER_BLOCK
    assert list(result["policies"]) == ["prefix-aware", "lru+retention"]
    for figure in kvtier_memory.FIGURES:  # the top: the most of each over the policies
        name = f"{figure}_bytes_per_block"
        assert result[name] == max(measured[name] for measured in result["policies"].values())
    for measured in result["policies"].values():
        held, peak = (measured[f"nvme_restart_{f}_bytes_per_block"] for f in ("held", "peak"))
        assert 0 < held <= peak
    fitted = ("rss", "dram_rss", "nvme_restart_peak", "dram_restart_peak")
    most = max(result[f"{figure}_bytes_per_block"] for figure in fitted)
    assert result["within_estimate"] == (most <= INDEX_BYTES_PER_BLOCK)


def test_a_policy_reaches_the_tiers_it_is_measured_under(tmp_path):
    cfg = kvtier_memory.config(tmp_path, 64, dram=True, policy=kvtier_memory.Policy("lru", 60.0))
    assert (cfg.dram.eviction, cfg.nvme.eviction, cfg.retention_s) == ("lru", "lru", 60.0)
    assert kvtier_memory.Policy("prefix-aware", None).name == "prefix-aware"
    leaves = kvtier_memory.Policy("prefix-aware", 60.0, chain=1, touches=5)
    assert leaves.name == "prefix-aware+retention+chains of 1, 5 touches"
    assert eval(repr(leaves), vars(kvtier_memory)) == leaves  # as _fresh passes it on
