"""The engine-facing client against a real in-process sidecar: bit-exact round trips through
every tier, graceful degradation when the sidecar is absent, and tenant isolation."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from strata.worker.kv_connector import BlockRef, chain_hashes, root_hash
from strata.worker.kvtier import client as client_module
from strata.worker.kvtier.arena import checksum
from strata.worker.kvtier.blockcopy import COPY_THREADS, DEVICE_COPY_THREADS
from strata.worker.kvtier.client import TierClient, connect, save_batches

from .conftest import MiB, worker_config

SHAPE = (2, 2, 16, 2, 32)  # layers, K/V, block_size, kv heads, head_dim


def chain(namespace: str, tokens: list[int]) -> list[BlockRef]:
    root = root_hash(namespace, "m", 16)
    hashes = chain_hashes(root, tokens, 16)
    return [BlockRef(h, p, i) for i, (h, p) in enumerate(zip(hashes, [root, *hashes[:-1]], strict=True))]


def blocks_for(refs: list[BlockRef], dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(SHAPE, generator=gen).to(dtype) for _ in refs]


def client_for(root: Path, dtype: torch.dtype = torch.float32, namespace: str = "default") -> TierClient:
    client = connect(worker_config(root, namespace), SHAPE, dtype)
    assert isinstance(client, TierClient)
    return client


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dram_round_trip_is_bit_exact(root, start_sidecar, dtype):
    start_sidecar(worker_config(root).kvtier)
    client = client_for(root, dtype)
    refs = chain("default", list(range(16 * 6)))
    data = blocks_for(refs, dtype)
    client.save(refs, data)
    hashes = [r.hash for r in refs]
    assert client.lookup(hashes) == ["dram"] * 6
    out = [torch.empty(SHAPE, dtype=dtype) for _ in refs]
    assert client.load(hashes, out) == 6
    for got, want in zip(out, data, strict=True):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("tier", ["nvme", "shared"])
def test_lower_tier_round_trip_is_bit_exact(root, start_sidecar, tier):
    # DRAM holds 2 blocks, so 12 blocks push 10 down to NVMe (or, NVMe off, to the shared tier).
    overrides: dict[str, Any] = {"dram": {"capacity_bytes": 2 * 16384}}
    if tier == "shared":
        overrides |= {"nvme": {"capacity_bytes": 0}, "shared": {"enabled": True}}
    start_sidecar(worker_config(root, **overrides).kvtier)
    client = client_for(root)
    refs = chain("default", list(range(16 * 12)))
    data = blocks_for(refs, torch.float32, seed=1)
    client.save(refs, data)
    hashes = [r.hash for r in refs]
    found = client.lookup(hashes)
    assert len(found) == 12 and found.count(tier) == 10, found
    out = [torch.empty(SHAPE) for _ in refs]
    assert client.load(hashes, out) == 12
    for got, want in zip(out, data, strict=True):
        assert torch.equal(got, want)


def test_sidecar_down_means_misses_and_dropped_saves(root):
    client = client_for(root)
    refs = chain("default", list(range(32)))
    client.save(refs, blocks_for(refs, torch.float32))  # dropped, no exception
    assert client.lookup([r.hash for r in refs]) == []
    assert client.load([r.hash for r in refs], [torch.empty(SHAPE) for _ in refs]) == 0
    client.prefetch([r.hash for r in refs])
    client.close()


def test_client_reconnects_after_sidecar_restart(root, start_sidecar):
    config = worker_config(root).kvtier
    first = start_sidecar(config)
    client = client_for(root)
    client.retry_s = 0.0
    refs = chain("default", list(range(48)))
    client.save(refs, blocks_for(refs, torch.float32))
    first.stop()
    assert client.lookup([r.hash for r in refs]) == []  # down: a miss, not an exception
    start_sidecar(config)
    # A restarted sidecar recovers its NVMe tier; write-back kept these blocks in DRAM only.
    client.save(refs, blocks_for(refs, torch.float32))
    assert client.lookup([r.hash for r in refs]) == ["dram"] * 3


def test_tenants_never_see_each_others_blocks(root, start_sidecar):
    start_sidecar(worker_config(root, shared={"enabled": True}).kvtier)
    alice, bob = client_for(root, namespace="alice"), client_for(root, namespace="bob")
    tokens = list(range(64))  # the same prompt
    alice_refs, bob_refs = chain("alice", tokens), chain("bob", tokens)
    assert not {r.hash for r in alice_refs} & {r.hash for r in bob_refs}
    alice.save(alice_refs, blocks_for(alice_refs, torch.float32))
    assert bob.lookup([r.hash for r in bob_refs]) == []
    assert bob.load([r.hash for r in bob_refs], [torch.empty(SHAPE) for _ in bob_refs]) == 0
    assert alice.lookup([r.hash for r in alice_refs]) == ["dram"] * 4


def test_corrupt_dram_block_is_dropped_not_served(root, start_sidecar):
    sidecar = start_sidecar(worker_config(root).kvtier)
    client = client_for(root)
    refs = chain("default", list(range(48)))
    assert client.save_checked(refs, blocks_for(refs, torch.float32)) == len(refs)
    assert sidecar.service.wait_sealed(60)  # checksums are taken in the background
    dram = sidecar.service.dram
    assert dram is not None
    entry = dram.index.get(refs[1].hash)
    assert entry is not None
    dram.block(entry.slot)[100] ^= 0xFF  # a stray write into shared memory
    out = [torch.empty(SHAPE) for _ in refs]
    assert client.load([r.hash for r in refs], out) == 1
    assert client.lookup([r.hash for r in refs]) == ["dram"]  # dropped from the tier
    assert client.corrupt_blocks == 1
    assert sidecar.metrics.corrupt_blocks.labels("dram")._value.get() == 1


@pytest.mark.parametrize("verify_reads", [True, False])
def test_torn_nvme_block_is_never_served_through_staging(root, start_sidecar, verify_reads):
    """DRAM off: NVMe blocks come up through staging slots. A client that checks its reads
    checks them along its copy out (the sidecar does not hash them first) and reports the torn
    one; with ``verify_reads: false`` the sidecar checks them. Either way the load ends before
    the torn block, which is dropped from NVMe."""
    config = worker_config(root, dram={"capacity_bytes": 0, "verify_reads": verify_reads})
    sidecar = start_sidecar(config.kvtier)
    client = client_for(root)
    refs = chain("default", list(range(16 * 6)))
    hashes = [r.hash for r in refs]
    data = blocks_for(refs, torch.float32, seed=2)
    assert client.save_checked(refs, data) == 6
    nvme = sidecar.service.nvme
    assert nvme is not None
    entry = nvme.index.get(hashes[2])
    assert entry is not None
    with open(nvme.store.directory / "blocks.dat", "r+b") as disk:  # torn on disk, no record
        disk.seek(entry.slot * nvme.store.slot_bytes + 100)
        disk.write(b"\xff" * 8)
    out = [torch.zeros(SHAPE) for _ in refs]
    assert client.load(hashes, out) == 2
    assert all(torch.equal(o, d) for o, d in zip(out[:2], data[:2], strict=True))
    assert client.corrupt_blocks == (1 if verify_reads else 0)  # who caught it
    assert sidecar.metrics.corrupt_blocks.labels("nvme")._value.get() == 1
    assert client.lookup(hashes) == ["nvme"] * 2  # the torn block is gone from the index
    assert client.load(hashes[3:], out[3:]) == 3  # those after it still come back whole
    assert all(torch.equal(o, d) for o, d in zip(out[3:], data[3:], strict=True))


def test_saves_into_dram_carry_their_checksums(root, start_sidecar):
    """The client hashes along its copy, so a block read right after its save is checked: the
    sidecar's sealer (a second pass over the slot) has nothing left to do."""
    sidecar = start_sidecar(worker_config(root).kvtier)
    client = client_for(root)
    assert client.stats() is not None  # connected: the sidecar's tiers are set up
    assert sidecar.service.state.sealer is not None
    sidecar.service.state.sealer.stop()  # so that only the client's checksums can be there
    refs = chain("default", list(range(48)))
    data = blocks_for(refs, torch.float32)
    assert client.save_checked(refs, data) == len(refs)
    dram = sidecar.service.dram
    assert dram is not None
    for ref, block in zip(refs, data, strict=True):
        entry = dram.index.get(ref.hash)
        assert entry is not None and entry.checksum == checksum(block.numpy().tobytes())
    assert client.load([r.hash for r in refs], [torch.empty(SHAPE) for _ in refs]) == len(refs)
    assert client.unverified_blocks == 0


def test_block_size_mismatch_degrades(root, start_sidecar):
    start_sidecar(worker_config(root).kvtier, block_bytes=4 * MiB)
    client = client_for(root)
    refs = chain("default", list(range(32)))
    client.save(refs, blocks_for(refs, torch.float32))
    assert client.lookup([r.hash for r in refs]) == []


def test_pinned_prefixes_are_pinned_on_connect(root, start_sidecar):
    config = worker_config(root, dram={"capacity_bytes": 4 * 16384}, nvme={"capacity_bytes": 0})
    system = "You are a helpful assistant. " * 3  # byte tokenizer: 87 tokens, 5 full blocks
    config = config.model_copy(
        update={"kvtier": config.kvtier.model_copy(update={"pinned_prefixes": [system]})}
    )
    start_sidecar(config.kvtier)
    client = connect(config, SHAPE, torch.float32)
    assert isinstance(client, TierClient)
    root_key = root_hash("default", "m", 16)
    tokens = list(system.encode())
    pinned = chain_hashes(root_key, tokens, 16)[:2]
    assert client.stats() is not None  # connects and sends the pins
    refs = [BlockRef(h, p, i) for i, (h, p) in enumerate(zip(pinned, [root_key, pinned[0]], strict=True))]
    client.save(refs, blocks_for(refs, torch.float32))
    other = chain("default", list(range(1000, 1000 + 16 * 8)))
    client.save(other, blocks_for(other, torch.float32))  # far more than the 4 DRAM slots
    assert client.lookup(pinned) == ["dram", "dram"]


def test_concurrent_clients_only_ever_read_intact_blocks(root, start_sidecar):
    # A small DRAM tier under two writers and two readers: evictions, demotions, promotions and
    # leases all race; every block that comes back must be exactly what was saved.
    start_sidecar(worker_config(root, dram={"capacity_bytes": 6 * 16384}).kvtier)
    chains = [chain("default", list(range(1000 * c, 1000 * c + 16 * 8))) for c in range(4)]
    data = [blocks_for(refs, torch.float32, seed=c) for c, refs in enumerate(chains)]
    errors: list[str] = []

    def work(worker: int) -> None:
        client = client_for(root)
        for round_ in range(15):
            c = (worker + round_) % len(chains)
            if worker % 2 == 0:
                client.save(chains[c], data[c])
                continue
            out = [torch.empty(SHAPE) for _ in chains[c]]
            got = client.load([r.hash for r in chains[c]], out)
            for i in range(got):
                if not torch.equal(out[i], data[c][i]):
                    errors.append(f"chain {c} block {i} differs")
        client.close()

    threads = [threading.Thread(target=work, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    final = client_for(root)
    out = [torch.empty(SHAPE) for _ in chains[0]]
    assert final.load([r.hash for r in chains[0]], out) == 8  # everything reachable in the end
    assert all(torch.equal(o, d) for o, d in zip(out, data[0], strict=True))


def test_long_saves_and_loads_through_nvme_are_pipelined_and_a_damaged_block_stops_a_load(
    root, start_sidecar
):
    # DRAM off: 100 blocks go down through staging slots 32 per put, the next batch copied
    # while the sidecar writes the last, with the checksums the client took along its copies;
    # they come up in answers of at most half the staging slots, the sidecar reading the next
    # answer while the client copies the current one out.
    config = worker_config(root, dram={"capacity_bytes": 0}, nvme={"capacity_bytes": 128 * 16384})
    sidecar = start_sidecar(config.kvtier)
    client = client_for(root)
    refs = chain("default", list(range(16 * 100)))
    data = blocks_for(refs, torch.float32, seed=3)
    assert client.save_checked(refs, data) == 100
    nvme = sidecar.service.nvme
    assert nvme is not None
    for ref, block in zip(refs, data, strict=True):
        entry = nvme.index.get(ref.hash)
        assert entry is not None and entry.checksum == checksum(block.numpy().tobytes())
    out = [torch.empty(SHAPE) for _ in refs]
    assert client.load([r.hash for r in refs], out) == 100
    assert all(torch.equal(o, d) for o, d in zip(out, data, strict=True))
    slot = nvme.index.get(refs[50].hash).slot
    with open(root / "nvme" / "blocks.dat", "r+b") as blocks:  # damage block 50, in the 2nd answer
        blocks.seek(slot * 16384 + 10)
        blocks.write(b"\xff" * 8)
    assert client.load([r.hash for r in refs], [torch.empty(SHAPE) for _ in refs]) == 50
    assert client.lookup([r.hash for r in refs]) == ["nvme"] * 50  # the damaged block is gone
    assert client.stats() is not None  # every answer was given back: no lease is left
    assert sidecar.service.dram is not None and not sidecar.service.dram._leases


def test_a_load_of_many_answers_through_nvme_brings_every_block(root, start_sidecar):
    # 300 blocks: six answers from the 96 staging slots, each read ahead while the one before
    # is copied out; an answer read ahead must find room beside the one being copied.
    config = worker_config(root, dram={"capacity_bytes": 0}, nvme={"capacity_bytes": 320 * 16384})
    start_sidecar(config.kvtier)
    client = client_for(root)
    refs = chain("default", list(range(16 * 300)))
    data = blocks_for(refs, torch.float32, seed=5)
    assert client.save_checked(refs, data) == 300
    out = [torch.empty(SHAPE) for _ in refs]
    assert client.load([r.hash for r in refs], out) == 300
    assert all(torch.equal(o, d) for o, d in zip(out, data, strict=True))
    assert client.stats() is not None  # the read-ahead past the end was given back


@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 40, 96])
def test_save_batches_cover_every_block_once_starting_short(count):
    spans = save_batches(count, 32)
    assert [i for start, stop in spans for i in range(start, stop)] == list(range(count))
    assert all(0 < stop - start <= 32 for start, stop in spans)
    if count > 8:
        assert spans[0] == (0, 8)  # the first batch is copied with the disk idle: a short one


def test_a_cuda_engines_client_hashes_on_more_threads(root):
    # (connecting is lazy: no sidecar, and no GPU, is needed to build the client)
    assert client_for(root).threads == COPY_THREADS
    client = connect(worker_config(root), SHAPE, torch.float32, torch.device("cuda"))
    assert isinstance(client, TierClient) and client.threads == DEVICE_COPY_THREADS > COPY_THREADS


def test_the_gpu_hash_is_the_configs_to_turn_off(root, monkeypatch):
    warmed: list[int] = []
    monkeypatch.setattr(client_module, "warm_gpu_hash", lambda device, size: warmed.append(size))
    cuda = torch.device("cuda")  # (connecting is lazy: no GPU is needed to build the client)
    on = connect(worker_config(root), SHAPE, torch.float32, cuda)
    assert isinstance(on, TierClient) and on.gpu_hash and warmed
    warmed.clear()
    off = connect(worker_config(root, gpu_checksums=False), SHAPE, torch.float32, cuda)
    assert isinstance(off, TierClient) and not off.gpu_hash and not warmed
