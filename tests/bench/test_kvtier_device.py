"""The GPU benchmark's passes, small: on the CPU here (host copies), on CUDA with
STRATA_TEST_DEVICE=cuda (tools/device/check.sh)."""

from __future__ import annotations

import os

import pytest
import torch

from bench import bench_kvtier_device
from bench.kvtier_device import NVME_RATIOS, device_bandwidth, ratios
from strata.worker.kvtier.blockcopy import DEVICE_COPY_THREADS

DEVICE = torch.device(os.environ.get("STRATA_TEST_DEVICE", "cpu"))


def test_the_device_passes_move_every_block_through_the_dram_tier_and_back(tmp_path):
    clients = (("dram", DEVICE_COPY_THREADS, True), ("dram_host_t2", 2, False))
    result = device_bandwidth(tmp_path, DEVICE, blocks=4, repeats=2, clients=clients)
    for name, measured, against in ratios(["dram", "dram_host_t2"]):
        assert result[f"{measured}_gbps"] > 0 and result[f"{against}_gbps"] > 0
        assert result["ratios"][name] > 0
    assert "dram_host_t2_save_over_d2h" in result["ratios"]
    for name, measured, against in NVME_RATIOS:  # a full NVMe tier, against staged direct I/O
        assert result[f"{measured}_gbps"] > 0 and result[f"{against}_gbps"] > 0
        assert result["ratios"][name] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU machine measures")
def test_without_cuda_the_benchmark_says_it_measured_nothing():
    result = bench_kvtier_device.run()
    assert result == {"measured": False, "summary": "no CUDA device on this machine: nothing measured"}
