"""Block copies with their checksums taken along: the fused copy-and-hash equals a plain copy
followed by the slot's checksum, whatever the block's size against the chunk size, on the
compiled path and on the Python fallback alike, and bad pairs are refused before any raw copy."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import xxhash

from strata.worker.kvtier import arena, blockcopy, native
from strata.worker.kvtier.arena import checksum
from strata.worker.kvtier.blockcopy import (
    CHUNK_BYTES,
    NATIVE_CHUNK_BYTES,
    copy_blocks,
    copy_hashing,
    copy_hashing_addresses,
    flat_bytes,
    host_copy,
    host_sources,
    save_blocks,
    slot_hash,
)


def random_bytes(count: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (count,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(params=["native", "python"])
def path(request, monkeypatch):
    """Each test on both paths: the compiled routine (where a compiler is) and the fallback."""
    if request.param == "python":
        monkeypatch.setattr(blockcopy, "copyhash", lambda: None)
    elif native.copyhash() is None:
        pytest.skip("no compiled routine here")
    return request.param


SIZES = [1, 4096, NATIVE_CHUNK_BYTES + 1, CHUNK_BYTES, CHUNK_BYTES + 1, 3 * CHUNK_BYTES - 7]


@pytest.mark.parametrize("size", SIZES)
def test_copy_hashing_copies_and_hashes_what_it_copied(path, size):
    src, dst = random_bytes(size), torch.zeros(size, dtype=torch.uint8)
    crc = copy_hashing(dst, src)
    assert torch.equal(dst, src)
    assert crc == checksum(src.numpy().data)


def test_host_copy_of_a_block_tensor_is_bit_exact():
    block = torch.randn(2, 16, 3).to(torch.bfloat16)
    out = torch.empty_like(block)
    host_copy(flat_bytes(out), flat_bytes(block))
    assert torch.equal(out.view(torch.int16), block.view(torch.int16))


@pytest.mark.parametrize(
    ("dst", "src", "message"),
    [
        (torch.zeros(8, dtype=torch.uint8), torch.zeros(9, dtype=torch.uint8), "9 bytes into 8"),
        (torch.zeros(8), torch.zeros(8), "uint8"),
        (torch.zeros(4, 4, dtype=torch.uint8), torch.zeros(4, 4, dtype=torch.uint8), "flat"),
        (torch.zeros(16, dtype=torch.uint8)[::2], torch.zeros(8, dtype=torch.uint8), "contiguous"),
    ],
)
def test_bad_pairs_are_refused_before_copying(path, dst, src, message):
    with pytest.raises(ValueError, match=message):
        copy_hashing(dst, src)
    with pytest.raises(ValueError, match=message):
        host_copy(dst, src)
    with ThreadPoolExecutor(2) as pool, pytest.raises(ValueError, match=message):
        save_blocks(pool, [(torch.zeros(8, dtype=torch.uint8),) * 2, (dst, src)], [False, False], False)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("count", [1, 6])
def test_batches_return_each_blocks_checksum_in_order(path, count, stream):
    """Saved into slots and loaded back out of them (``stream``: as the client loads, storing
    past the cache)."""
    sources = [random_bytes(CHUNK_BYTES + 100 * seed, seed) for seed in range(count)]
    slots = [torch.zeros_like(s) for s in sources]
    with ThreadPoolExecutor(4) as pool:
        saved = save_blocks(pool, list(zip(slots, sources, strict=True)), [False] * count, page_locked=False)
        out = [torch.zeros_like(s) for s in sources]
        pairs = list(zip(out, slots, strict=True))
        loaded = copy_blocks(pool, pairs, hashed=True, page_locked=False, stream=stream)
    expected = [checksum(s.numpy().data) for s in sources]
    assert saved == expected and loaded == expected
    assert [slot_hash(s) for s in slots] == expected
    assert all(torch.equal(o, s) for o, s in zip(out, sources, strict=True))


def test_host_sources_are_the_blocks_addresses_and_refuse_what_a_raw_copy_must_not_trust():
    blocks = [torch.randn(2, 16, 3).to(torch.bfloat16) for _ in range(3)]
    size = blocks[0].numel() * blocks[0].element_size()
    assert host_sources(blocks, size) == [b.data_ptr() for b in blocks]
    with pytest.raises(ValueError, match="contiguous"):
        host_sources([blocks[0], torch.randn(3, 16, 2).to(torch.bfloat16).transpose(0, 2)], size)
    with pytest.raises(ValueError, match=f"{2 * size} bytes into {size}"):
        host_sources([torch.randn(4, 16, 3).to(torch.bfloat16)], size)


def test_copies_by_address_equal_copies_by_view(path):
    sources = [random_bytes(CHUNK_BYTES + 100 * seed, seed) for seed in range(5)]
    slots = [torch.zeros_like(s) for s in sources]
    copies = [(d.data_ptr(), s.data_ptr(), s.numel()) for d, s in zip(slots, sources, strict=True)]
    with ThreadPoolExecutor(4) as pool:
        sums = copy_hashing_addresses(pool, copies)
        streamed = [torch.zeros_like(s) for s in sources]
        moved = [(d.data_ptr(), s.data_ptr(), s.numel()) for d, s in zip(streamed, sources, strict=True)]
        streamed_sums = copy_hashing_addresses(pool, moved, stream=True)
    assert sums == streamed_sums == [checksum(s.numpy().data) for s in sources]
    assert all(torch.equal(d, s) for d, s in zip(slots + streamed, sources + sources, strict=True))


@pytest.mark.parametrize("size", [0, 1, 4096, 3 * CHUNK_BYTES - 7])
def test_the_tiers_checksum_is_xxh3_by_either_routine(size, monkeypatch):
    # Writable memory (a slot, a read buffer) is hashed by the compiled routine, which lets go of
    # the GIL; bytes and read-only views by xxhash: the same value either way.
    data = random_bytes(size, 3).numpy().tobytes()
    want = xxhash.xxh3_64_intdigest(data)
    writable = memoryview(bytearray(data))
    assert checksum(writable) == checksum(data) == checksum(memoryview(data)) == want
    monkeypatch.setattr(arena, "copyhash", lambda: None)
    assert checksum(writable) == want
