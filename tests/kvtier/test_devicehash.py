"""The GPU's XXH3 (devicehash, xxh3parts): equal to the host's checksum for every layout of an
input. The Triton kernel runs interpreted on host tensors here (TRITON_INTERPRET=1, in a child
process: the flag is read when the kernel is defined) and on the GPU with
STRATA_TEST_DEVICE=cuda (tools/device/check.sh)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import xxhash

from strata.worker.kvtier import blockcopy, devicehash, xxh3parts

DEVICE = torch.device(os.environ.get("STRATA_TEST_DEVICE", "cpu"))
# Past 240 bytes: no whole block; one and a word (a one-stripe tail); 12 whole blocks (one
# unrolled group and 4 more) and a word; 2 MiB, the engine's block on a GPU.
LENGTHS = (248, 1032, 12 * 1024 + 8, 2 << 20)

INTERPRETED_RUN = """
import json, sys, torch
from strata.worker.kvtier import devicehash
seeded = torch.Generator().manual_seed(7)
blocks = [torch.randint(0, 256, (n,), dtype=torch.uint8, generator=seeded) for n in json.loads(sys.argv[1])]
print(json.dumps([[b.tolist(), devicehash.checksums([b])[0]] for b in blocks]))
"""


def test_the_secret_is_the_headers_192_bytes():
    assert len(xxh3parts.secret()) == 192
    assert xxh3parts.secret()[:4] == bytes([0xB8, 0xFE, 0x6C, 0x39])


def test_a_layout_refuses_inputs_the_gpu_path_does_not_take():
    for length in (240, 1001):
        with pytest.raises(ValueError, match=f"length: .*{length}"):
            xxh3parts.layout(length)
    assert xxh3parts.layout(2 << 20) == xxh3parts.Layout(2 << 20, 2047, 15, (2 << 20) // 8 - 8)


@pytest.mark.skipif(
    DEVICE.type == "cuda", reason="on a GPU the kernels run themselves (Triton 3.6's interpreter fails)"
)
def test_the_interpreted_kernels_give_xxh3_for_every_layout():
    lengths = [n for n in LENGTHS if n < 1 << 16]  # interpreted, 2 MiB takes seconds
    env = os.environ | {"TRITON_INTERPRET": "1"}
    run = [sys.executable, "-c", INTERPRETED_RUN, json.dumps(lengths)]
    done = subprocess.run(run, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    for data, got in json.loads(done.stdout):
        assert got == xxhash.xxh3_64_intdigest(bytes(data))


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the kernel on a GPU (STRATA_TEST_DEVICE=cuda)")
def test_on_the_gpu_blocks_within_one_cache_hash_like_the_host():
    cache = torch.randint(0, 256, (6, 2 << 20), dtype=torch.uint8, device=DEVICE)
    blocks = [cache[i] for i in (4, 0, 5)]  # views into one tensor, out of order
    expected = [xxhash.xxh3_64_intdigest(b.cpu().numpy().tobytes()) for b in blocks]
    assert devicehash.checksums(blocks) == expected
    for n in LENGTHS:
        block = torch.randint(0, 256, (n,), dtype=torch.uint8, device=DEVICE)
        assert devicehash.checksums([block]) == [xxhash.xxh3_64_intdigest(block.cpu().numpy().tobytes())]


def test_blocks_the_gpu_cannot_hash_are_left_to_the_host():
    assert not devicehash.usable([])
    if not devicehash.INTERPRETED:
        assert not devicehash.usable([torch.zeros(4096, dtype=torch.uint8)])  # host memory
    odd = torch.zeros(1001, dtype=torch.uint8, device=DEVICE)
    assert not devicehash.usable([odd])
    with pytest.raises(ValueError, match="blocks: "):
        devicehash.checksums([odd])


def test_a_failing_gpu_hash_leaves_hashing_to_the_host(monkeypatch, caplog):
    def broken(blocks, checked=False):
        raise RuntimeError("no kernel here")

    monkeypatch.setattr(devicehash, "checksums", broken)
    monkeypatch.setattr(blockcopy, "_gpu_hash_failed", False)
    assert blockcopy._hashed_by_gpu([torch.zeros(4096, dtype=torch.uint8, device=DEVICE)]) is None
    assert blockcopy._gpu_hash_failed
    assert any(getattr(r, "event", "") == "gpu_hash_failed" for r in caplog.records)


def _slots_and_blocks(count: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    slots = [torch.randint(0, 256, (4096,), dtype=torch.uint8) for _ in range(count)]
    return slots, [torch.empty(4096, dtype=torch.uint8, device=DEVICE) for _ in slots]


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the kernel on a GPU (STRATA_TEST_DEVICE=cuda)")
def test_on_the_gpu_loads_and_saves_return_the_hosts_checksums(monkeypatch):
    monkeypatch.setattr(blockcopy, "_gpu_hash_failed", False)
    slots, blocks = _slots_and_blocks(5)  # loaded in parts of 2, 2 and 1
    expected = [xxhash.xxh3_64_intdigest(s.numpy().tobytes()) for s in slots]
    with ThreadPoolExecutor(2) as pool:
        assert (
            blockcopy.copy_blocks(pool, list(zip(blocks, slots, strict=True)), hashed=True, page_locked=False)
            == expected
        )
        assert all(torch.equal(b.cpu(), s) for b, s in zip(blocks, slots, strict=True))
        saved = [torch.zeros_like(s) for s in slots]
        sums = blockcopy.save_blocks(
            pool, list(zip(saved, blocks, strict=True)), [False] * 5, page_locked=False
        )
    assert sums == expected and all(torch.equal(a, s) for a, s in zip(saved, slots, strict=True))
    assert not blockcopy._gpu_hash_failed


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the kernel on a GPU (STRATA_TEST_DEVICE=cuda)")
def test_on_the_gpu_a_load_whose_hash_fails_is_checked_by_the_host(monkeypatch):
    def broken(blocks):
        raise RuntimeError("no kernel here")

    monkeypatch.setattr(devicehash, "queue", broken)
    monkeypatch.setattr(blockcopy, "_gpu_hash_failed", False)
    slots, blocks = _slots_and_blocks(3)
    with ThreadPoolExecutor(2) as pool:
        sums = blockcopy.copy_blocks(
            pool, list(zip(blocks, slots, strict=True)), hashed=True, page_locked=False
        )
    assert sums == [xxhash.xxh3_64_intdigest(s.numpy().tobytes()) for s in slots]
    assert (
        all(torch.equal(b.cpu(), s) for b, s in zip(blocks, slots, strict=True))
        and blockcopy._gpu_hash_failed
    )


def test_warming_up_builds_the_kernels_for_the_engines_block_size(monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger=blockcopy.__name__)
    hashed: list[int] = []

    def recorded(blocks, checked=False):
        hashed.append(blocks[0].numel())
        return [0]

    monkeypatch.setattr(blockcopy, "_gpu_hash_failed", False)
    monkeypatch.setattr(devicehash, "usable", lambda blocks: True)
    monkeypatch.setattr(devicehash, "checksums", recorded)
    assert blockcopy.warm_gpu_hash(DEVICE, 8192) and hashed == [8192]
    assert any(getattr(r, "event", "") == "gpu_hash_ready" for r in caplog.records)


def test_without_a_gpu_hash_warming_up_says_the_host_hashes(caplog):
    caplog.set_level(logging.INFO, logger=blockcopy.__name__)
    if DEVICE.type == "cuda":
        assert blockcopy.warm_gpu_hash(DEVICE, 2 << 20)  # the real kernels, built
        return
    assert not blockcopy.warm_gpu_hash(DEVICE, 8192)
    assert any(getattr(r, "event", "") == "gpu_hash_unavailable" for r in caplog.records)
