"""The benchmark's lookup latency during write-through saves and during loads from NVMe, small:
it measures lookups that ran while the saves or loads did, and these store or load every block
(a short load fails the pass)."""

from __future__ import annotations

from typing import Any

from bench.kvtier_latency import load_lookup_latency, lookup_latency


def test_lookups_are_timed_while_write_through_saves_run(tmp_path):
    assert_percentiles(lookup_latency(tmp_path, blocks=16, shape=(4, 1024), saves=6))


def test_lookups_are_timed_while_chains_are_loaded_from_nvme(tmp_path):
    assert_percentiles(load_lookup_latency(tmp_path, blocks=16, shape=(4, 1024), loads=4))


def assert_percentiles(figures: dict[str, Any]) -> None:
    assert figures["lookups"] >= 1
    assert 0 < figures["p50_ms"] <= figures["p90_ms"] <= figures["p99_ms"] <= figures["max_ms"]
