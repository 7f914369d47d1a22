"""KV-tier benchmark on a GPU: the tiers' device path next to the copy engine's own rate
(``kvtier_device``), and time to first token with the engine on the GPU, computed cold and
served from HBM, DRAM and NVMe (``bench_kvtier.ttft``), from one run. Needs CUDA: on a machine
without it the result says so and measures nothing (tools/device/check.sh runs it on a GPU)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.bench_kvtier import ttft, ttft_ratios
from bench.kvtier_device import device_bandwidth


def run() -> dict[str, Any]:
    if not torch.cuda.is_available():
        return {"measured": False, "summary": "no CUDA device on this machine: nothing measured"}
    device = torch.device("cuda")
    root = Path(tempfile.mkdtemp(prefix="kvbench-", dir="/tmp"))
    try:
        result: dict[str, Any] = {"measured": True, "device_name": torch.cuda.get_device_name(device)}
        result |= device_bandwidth(root, device)
        result["ttft_s"] = ttft(root, device)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["ratios"] |= ttft_ratios(result["ttft_s"])
    result["summary"] = ", ".join(f"{k} {v}" for k, v in result["ratios"].items())
    return result
