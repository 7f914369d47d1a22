"""The sidecar memory benchmark's plumbing: a fresh interpreter fills both lower tiers through the
real put path, another a DRAM tier, others restart on them, and the figures are per block held
(their size is the benchmark's to report)."""

from __future__ import annotations

from bench import kvtier_memory
from strata.worker.kvtier.budget import INDEX_BYTES_PER_BLOCK


def test_the_memory_bench_fills_both_lower_tiers_and_reports_per_block():
    result = kvtier_memory.run(blocks=640)
    assert result["blocks_per_tier"] == 640 and result["tiers"] == ["nvme", "shared"]
    assert result["estimate_bytes_per_block"] == INDEX_BYTES_PER_BLOCK
    figures = ("rss", "dram_rss", "nvme_restart_peak", "dram_restart_peak")
    most = max(result[f"{figure}_bytes_per_block"] for figure in figures)
    assert 0 < result["nvme_restart_held_bytes_per_block"] <= result["nvme_restart_peak_bytes_per_block"]
    assert result["within_estimate"] == (most <= INDEX_BYTES_PER_BLOCK)
