"""What the KV-tier sidecar's memory holds per block it indexes, next to the estimate it fits its
tiers by (``strata.common.kvbudget.INDEX_BYTES_PER_BLOCK``).

A fresh interpreter (nothing else loaded) builds the sidecar's service with an NVMe and a shared
tier of ``blocks`` blocks each (adaptive admission, write-through), saves ``blocks`` blocks in
chains of 32 through the real reserve and put path, reserves them all again (each a touch: the
prefix-aware order's heap takes stale entries), and reports its anonymous RSS grown per block
per tier; then the same in a fresh one for a DRAM tier of as many blocks, measured once the
sealer has taken every block's checksum, as a sidecar holds them (the puts bring none; measured
before, as until 2026-12-04, a DRAM block read 60-70 bytes less by how far the sealer had got).
Blocks of 4 KiB, so the tiers' files stay small; the index does not depend on the block size.

A restart needs more for a moment than it holds after (the NVMe log's records beside the index
built from them), so each is restarted too, in a fresh interpreter, measured in RSS
(``AnonPeak``: what the kernel charges, the allocator's overhead included, which ``tracemalloc``
does not see: 571 bytes a block of Python objects held after an NVMe tier's restart were 650
of RSS): the NVMe tier rebuilt from its log (the kernel's peak, and the anonymous RSS that
stayed, per block); the DRAM tier's sidecar restarted on its tier filled and on the same tier
half filled, until the blocks were verified (the anonymous RSS at its most, sampled every
millisecond since the tier's shared memory is in the kernel's peak, apart, per block the first
recovered more: what a restart reads back whatever the tier holds, the admission policies'
sketches, sized by the capacity and counted in the sidecar's fixed part, is in both).

All of it under each eviction order a ServiceTier may choose, with and without retention
(``POLICIES``): the figures at the top of the result are the most over them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, NamedTuple

from strata.common.kvbudget import INDEX_BYTES_PER_BLOCK

BLOCKS = 20_000
BLOCK_BYTES = 4096
CHAIN = 32


class Policy(NamedTuple):
    """What a ServiceTier chooses that changes the index's size a block: the eviction order
    (prefix-aware keeps a tree node and heap entries a block, LRU a linked entry) and whether
    blocks expire (``retention_s``: a recency list beside the order); and what the load does to
    it: requests of ``chain`` blocks (the prefix-aware order's heap holds only leaves: one a
    chain), each block touched ``touches`` times after its put (each touch of a leaf leaves a
    stale heap entry, until the heap is compacted at twice the blocks held)."""

    eviction: str
    retention_s: float | None
    chain: int = CHAIN
    touches: int = 1

    @property
    def name(self) -> str:
        name = self.eviction + ("+retention" if self.retention_s is not None else "")
        if (self.chain, self.touches) != (CHAIN, 1):
            name += f"+chains of {self.chain}, {self.touches} touches"
        return name


PREMIUM = Policy("prefix-aware", None)
POLICIES = (
    PREMIUM,
    Policy("lru", None),
    Policy("prefix-aware", 3600.0),
    Policy("lru", 3600.0),
    Policy("prefix-aware", 3600.0, chain=1, touches=5),  # every block a leaf, touched over and over
)
# What the estimate must cover: what a block holds and a restart's peak (what a rebuilt NVMe
# index keeps after its peak is reported beside them, below the peak).
FITTED = ("rss", "dram_rss", "nvme_restart_peak", "dram_restart_peak")
FIGURES = (*FITTED, "nvme_restart_held")


def status_bytes(field: str) -> int:
    """A figure of /proc/self/status (``RssAnon``, ``VmRSS``, ``VmHWM``: the peak), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"kvtier memory bench: no {field} in /proc/self/status")


class AnonPeak:
    """Within ``with``: the most anonymous RSS seen (``peak``), sampled every millisecond (a
    restart's passing structures live for its whole pass), and what it was at the start and
    the end, in bytes. ``rss_peak``: the kernel's own peak of the whole RSS (``VmHWM``, reset
    at the start), exact, but with shared-memory pages in it: for what touches none."""

    def __enter__(self) -> AnonPeak:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")  # VmHWM from here
        self.rss_start = status_bytes("VmRSS")
        self.start = self.peak = status_bytes("RssAnon")
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join()
        self.end = status_bytes("RssAnon")
        self.peak = max(self.peak, self.end)
        self.rss_peak = status_bytes("VmHWM") - self.rss_start

    def _sample(self) -> None:
        while not self._done.wait(0.001):
            self.peak = max(self.peak, status_bytes("RssAnon"))


def key(n: int) -> bytes:
    return n.to_bytes(16, "big")


def config(root: Path, blocks: int, dram: bool, policy: Policy = PREMIUM) -> Any:
    """Room for ``blocks`` in each of the NVMe and shared tiers, or (``dram``) in a DRAM tier
    beside a small NVMe one, under ``policy``."""
    from strata.worker.config import KVTierConfig

    lower = 64 if dram else blocks
    return KVTierConfig.model_validate(
        {
            "enabled": True,
            "socket_path": str(root / "kv.sock"),
            "write_mode": "write-through",
            "retention_s": policy.retention_s,
            "dram": {
                "capacity_bytes": (blocks if dram else 256) * BLOCK_BYTES,
                "shm_path": str(root / "shm"),
                "eviction": policy.eviction,
                "admission": "adaptive",
            },
            "nvme": {
                "capacity_bytes": lower * BLOCK_BYTES,
                "path": str(root / "nvme"),
                "eviction": policy.eviction,
                "admission": "adaptive",
                "admit_after_hits": 0,
                "persistent": True,
            },
            "shared": {
                "enabled": not dram,
                "path": str(root / "shared"),
                "capacity_bytes": lower * BLOCK_BYTES,
            },
        }
    )


def fill(
    root: Path, blocks: int, dram: bool = False, filled: int | None = None, policy: Policy = PREMIUM
) -> dict[str, Any]:
    """In this process: the service with room for ``blocks`` given ``filled`` (all unless
    said), its RSS before and after (call in a fresh one). A DRAM block's slot is shared
    memory, not counted: only its index is."""
    from strata.worker.kvtier.service import KVTierService, Owner, PutBlock

    service = KVTierService(config(root, blocks, dram, policy), staging_slots=CHAIN)
    service.configure(BLOCK_BYTES)
    before = status_bytes("RssAnon")
    filled = blocks if filled is None else filled
    for start in range(0, filled, CHAIN):
        owner, numbers = Owner(), range(start, start + CHAIN)
        slots = service.reserve(owner, [key(n) for n in numbers])
        puts = [
            PutBlock(key(n), key(n - 1) if (n - start) % policy.chain else b"\xff" * 16, slot)
            for n, slot in zip(numbers, slots, strict=True)
            if slot is not None
        ]
        service.put(owner, puts)
    for _ in range(policy.touches):  # touch every block again
        for start in range(0, filled, CHAIN):
            owner = Owner()
            service.reserve(owner, [key(n) for n in range(start, start + CHAIN)])
            service.drop_owner(owner)
    if not service.wait_sealed(600):
        raise RuntimeError("kvtier memory bench: the DRAM blocks were not sealed")
    after = status_bytes("RssAnon")
    stats = service.stats()["tiers"]
    service.close()
    return {"before": before, "after": after, "tiers": stats}


def restart(root: Path, blocks: int, dram: bool = False, policy: Policy = PREMIUM) -> dict[str, Any]:
    """In this process (a fresh one): a sidecar restarted on what ``fill`` left in ``root``, and
    its anonymous RSS grown, at the most until its DRAM blocks were verified."""
    from strata.worker.kvtier.service import KVTierService

    with AnonPeak() as rss:
        service = KVTierService(config(root, blocks, dram, policy), staging_slots=CHAIN)
        service.configure(BLOCK_BYTES)
        if not service.wait_recovered(1800):
            raise RuntimeError("kvtier memory bench: the restarted sidecar's DRAM recovery did not finish")
    stats = service.stats()["tiers"]
    service.close()
    return {"peak": rss.peak - rss.start, "tiers": stats}


def nvme_restart(root: Path, blocks: int, policy: Policy = PREMIUM) -> dict[str, Any]:
    """In this process (a fresh one): the NVMe tier ``fill`` left in ``root`` rebuilt from its
    log, and the anonymous RSS that grew, at the most and after."""
    from strata.common.kvbudget import slot_bytes_for
    from strata.worker.kvtier.nvme import NvmeStore
    from strata.worker.kvtier.tiers import NvmeTier

    cfg = config(root, blocks, False, policy)
    nvme, expires = cfg.nvme, cfg.retention_s is not None  # as the service builds it
    store = NvmeStore(nvme.path, slot_bytes_for(BLOCK_BYTES), BLOCK_BYTES, blocks, nvme.io_threads)
    with AnonPeak() as rss:
        tier = NvmeTier(store, nvme.persistent, nvme.eviction, nvme.admission, expires)
    found = len(tier.index)
    store.close()
    return {"peak": rss.rss_peak, "held": rss.end - rss.start, "blocks": found}


def lower_tiers(blocks: int, policy: Policy) -> tuple[dict[str, Any], dict[str, Any]]:
    """NVMe and shared tiers of ``blocks`` filled (their figures), and the NVMe one rebuilt."""
    with tempfile.TemporaryDirectory(prefix="kvmem-", dir="/tmp") as root:
        filled = _fresh(f"fill(pathlib.Path({root!r}), {blocks}, policy={policy!r})")
        again = _fresh(f"nvme_restart(pathlib.Path({root!r}), {blocks}, {policy!r})")
    if again["blocks"] != blocks:
        raise RuntimeError(f"kvtier memory bench: the NVMe tier rebuilt {again['blocks']} blocks of {blocks}")
    return filled, again


def dram_tier(blocks: int, policy: Policy) -> tuple[dict[str, Any], int]:
    """A DRAM tier of ``blocks`` filled (its figures), and its restart's peak a block: restarted
    filled and half filled (in chains: ``CHAIN``), apart."""
    half = blocks // 2 // CHAIN * CHAIN
    peaks, figures = {}, {}
    for filled in (blocks, half):
        with tempfile.TemporaryDirectory(prefix="kvmem-", dir="/tmp") as root:
            args = f"pathlib.Path({root!r}), {blocks}, dram=True, policy={policy!r}"
            figures[filled] = _fresh(f"fill({args}, filled={filled})")
            again = _fresh(f"restart({args})")
        if again["tiers"]["dram"]["blocks"] != filled:
            raise RuntimeError(
                f"kvtier memory bench: a DRAM restart found {again['tiers']}, expected {filled} blocks"
            )
        peaks[filled] = again["peak"]
    return figures[blocks], round((peaks[blocks] - peaks[half]) / (blocks - half))


def run(blocks: int = BLOCKS, policies: tuple[Policy, ...] = POLICIES) -> dict[str, Any]:
    """Each figure under each of ``policies`` (``policies``), and at the top the most of each
    over them: what the estimate must cover whichever a ServiceTier chooses."""
    if blocks < 2 * CHAIN or blocks % CHAIN:
        raise ValueError(f"blocks: a multiple of {CHAIN} from {2 * CHAIN}, got {blocks}")
    measured = {policy.name: measure(blocks, policy) for policy in policies}
    most = {
        f"{figure}_bytes_per_block": max(m[f"{figure}_bytes_per_block"] for m in measured.values())
        for figure in FIGURES
    }
    fitted = max(most[f"{figure}_bytes_per_block"] for figure in FITTED)
    return (
        {"blocks_per_tier": blocks, "tiers": ["nvme", "shared"]}
        | most
        | {
            "estimate_bytes_per_block": INDEX_BYTES_PER_BLOCK,
            "within_estimate": fitted <= INDEX_BYTES_PER_BLOCK,
            "policies": measured,
        }
    )


def measure(blocks: int, policy: Policy) -> dict[str, int]:
    """The figures under one ``policy``, in bytes a block."""
    lower, rebuilt = lower_tiers(blocks, policy)
    in_dram, dram_restart_peak = dram_tier(blocks, policy)
    _check(lower, in_dram, blocks)
    return {
        "rss_bytes_per_block": round((lower["after"] - lower["before"]) / (2 * blocks)),
        "dram_rss_bytes_per_block": round((in_dram["after"] - in_dram["before"]) / blocks),
        "nvme_restart_peak_bytes_per_block": round(rebuilt["peak"] / blocks),
        "nvme_restart_held_bytes_per_block": round(rebuilt["held"] / blocks),
        "dram_restart_peak_bytes_per_block": dram_restart_peak,
    }


def _check(lower: dict[str, Any], in_dram: dict[str, Any], blocks: int) -> None:
    held = lower["tiers"]["nvme"]["blocks"] + lower["tiers"]["shared"]["blocks"]
    if held != 2 * blocks:
        raise RuntimeError(f"kvtier memory bench: expected {2 * blocks} blocks held, got {lower['tiers']}")
    if in_dram["tiers"]["dram"]["blocks"] != blocks:
        raise RuntimeError(f"kvtier memory bench: expected {blocks} DRAM blocks, got {in_dram['tiers']}")


def _fresh(call: str) -> dict[str, Any]:
    """``call`` (of this module's functions) in a fresh interpreter: nothing else loaded."""
    # The allocator's thresholds fixed first, as the sidecar does at its start.
    code = (
        "from strata.worker.kvtier import allocator; allocator.fix_thresholds(); "
        f"import json, pathlib; from bench.kvtier_memory import *; print(json.dumps({call}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=1800
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


if __name__ == "__main__":
    print(json.dumps(run(int(sys.argv[1]) if len(sys.argv) > 1 else BLOCKS), indent=1))
