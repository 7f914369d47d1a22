"""The benchmark's lookup latency during write-through saves, small: it measures lookups that
ran while the saves did, and the saves store every block."""

from __future__ import annotations

from bench.kvtier_latency import lookup_latency


def test_lookups_are_timed_while_write_through_saves_run(tmp_path):
    figures = lookup_latency(tmp_path, blocks=16, shape=(4, 1024), saves=6)
    assert figures["lookups"] >= 1
    assert 0 < figures["p50_ms"] <= figures["p90_ms"] <= figures["p99_ms"] <= figures["max_ms"]
