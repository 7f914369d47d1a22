"""Calibration benchmark: memcpy and a float32 matmul on this machine, so that other
results can be read against what the machine does at all on the day they were taken."""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def _best_of(fn: Any, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def run() -> dict[str, Any]:
    src = np.random.default_rng(0).integers(0, 255, size=256 * 2**20, dtype=np.uint8)
    dst = np.empty_like(src)
    copy_s = _best_of(lambda: np.copyto(dst, src))
    a = np.random.default_rng(1).standard_normal((1024, 1024), dtype=np.float32)
    mm_s = _best_of(lambda: a @ a)
    memcpy_gbps = round(src.nbytes / copy_s / 1e9, 2)
    gflops = round(2 * 1024**3 / mm_s / 1e9, 1)
    return {
        "memcpy_gbps": memcpy_gbps,
        "matmul_gflops": gflops,
        "summary": f"memcpy {memcpy_gbps} GB/s, fp32 matmul {gflops} GFLOP/s",
    }
