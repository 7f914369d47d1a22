"""The benchmark's in-process prefetch pass, small: each chain comes up from NVMe in turn."""

from __future__ import annotations

import torch

from bench.kvtier_bandwidth import in_process_tier, prefetch_passes

BLOCKS = 8
SHAPE = (4, 1024)  # 8 KiB in bfloat16: whole pages, as the tier's direct I/O wants


def test_the_prefetch_pass_reads_each_chain_back_from_nvme_in_turn(tmp_path, nvme_reads):
    blocks = [torch.randn(SHAPE).to(torch.bfloat16) for _ in range(BLOCKS)]
    block_bytes = blocks[0].numel() * blocks[0].element_size()
    dram = (BLOCKS + 2) * block_bytes  # one chain and a little: the other chain's prefetch evicts it
    with in_process_tier(tmp_path, "t", dram=dram, nvme=3 * dram, block_bytes=block_bytes) as service:
        prefetch = prefetch_passes(service, blocks)["nvme_prefetch"]
        for repeat in range(3):
            before = sum(nvme_reads)
            prefetch(repeat)
            assert sum(nvme_reads) - before >= BLOCKS - 2  # from the disk, not found in DRAM
        assert service.dram is not None
        chain = [service.dram.index.get(k) for k in service.dram.index]
        kept = [bytes(service.dram.block(e.slot)) for e in chain if e is not None]
        sources = {b.view(torch.uint8).reshape(-1).numpy().tobytes() for b in blocks}
        assert len(kept) >= BLOCKS and all(k in sources for k in kept)
