"""What the KV-tier sidecar's memory holds per block it indexes, next to the estimate it fits its
tiers by (``strata.worker.kvtier.budget.INDEX_BYTES_PER_BLOCK``).

A fresh interpreter (nothing else loaded) builds the sidecar's service with an NVMe and a shared
tier of ``blocks`` blocks each, under the policies the premium tier uses (prefix-aware eviction,
adaptive admission on NVMe, write-through), saves ``blocks`` blocks in chains of 32 through the
real reserve and put path, reserves them all again (each a touch: the prefix-aware order's heap
takes stale entries), and reports its anonymous RSS grown per block per tier. Blocks of 4 KiB,
so the tiers' files stay small; the index does not depend on the block size.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from strata.worker.kvtier.budget import INDEX_BYTES_PER_BLOCK

BLOCKS = 20_000
BLOCK_BYTES = 4096
CHAIN = 32


def rss_anon() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("kvtier memory bench: no RssAnon in /proc/self/status")


def key(n: int) -> bytes:
    return n.to_bytes(16, "big")


def fill(root: Path, blocks: int) -> dict[str, Any]:
    """In this process: the service filled, its RSS before and after (call in a fresh one)."""
    from strata.worker.config import KVTierConfig
    from strata.worker.kvtier.service import KVTierService, Owner, PutBlock

    config = KVTierConfig.model_validate(
        {
            "enabled": True,
            "socket_path": str(root / "kv.sock"),
            "write_mode": "write-through",
            "dram": {
                "capacity_bytes": 256 * BLOCK_BYTES,
                "shm_path": str(root / "shm"),
                "admission": "adaptive",
            },
            "nvme": {
                "capacity_bytes": blocks * BLOCK_BYTES,
                "path": str(root / "nvme"),
                "admission": "adaptive",
                "admit_after_hits": 0,
            },
            "shared": {"enabled": True, "path": str(root / "shared"), "capacity_bytes": blocks * BLOCK_BYTES},
        }
    )
    service = KVTierService(config, staging_slots=CHAIN)
    service.configure(BLOCK_BYTES)
    before = rss_anon()
    for start in range(0, blocks, CHAIN):
        owner, numbers = Owner(), range(start, start + CHAIN)
        slots = service.reserve(owner, [key(n) for n in numbers])
        puts = [
            PutBlock(key(n), key(n - 1) if n > start else b"\xff" * 16, slot)
            for n, slot in zip(numbers, slots, strict=True)
            if slot is not None
        ]
        service.put(owner, puts)
    for start in range(0, blocks, CHAIN):  # touch every block once more
        owner = Owner()
        service.reserve(owner, [key(n) for n in range(start, start + CHAIN)])
        service.drop_owner(owner)
    after = rss_anon()
    stats = service.stats()["tiers"]
    service.close()
    return {"before": before, "after": after, "tiers": stats}


def run(blocks: int = BLOCKS) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kvmem-", dir="/tmp") as root:
        code = (
            "import json, pathlib; from bench.kvtier_memory import fill; "
            f"print(json.dumps(fill(pathlib.Path({root!r}), {blocks})))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=1800
        )
    filled = json.loads(out.stdout.strip().splitlines()[-1])
    held = filled["tiers"]["nvme"]["blocks"] + filled["tiers"]["shared"]["blocks"]
    if held != 2 * blocks:
        raise RuntimeError(f"kvtier memory bench: expected {2 * blocks} blocks held, got {filled['tiers']}")
    per_block = round((filled["after"] - filled["before"]) / held)
    return {
        "blocks_per_tier": blocks,
        "tiers": ["nvme", "shared"],
        "rss_bytes_per_block": per_block,
        "estimate_bytes_per_block": INDEX_BYTES_PER_BLOCK,
        "within_estimate": per_block <= INDEX_BYTES_PER_BLOCK,
    }


if __name__ == "__main__":
    print(json.dumps(run(int(sys.argv[1]) if len(sys.argv) > 1 else BLOCKS), indent=1))
