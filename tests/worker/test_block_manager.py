"""The tensor-free block pool and prefix cache: references, LRU eviction, collision guard."""

from __future__ import annotations

import pytest

from strata.worker.engine.block_manager import BlockManager
from strata.worker.kv_connector import BlockRef, block_hash, chain_hashes, root_hash

ROOT = root_hash("tenant-a", "tiny", 4)


def ref(tokens: list[int], parent: bytes = ROOT, position: int = 0) -> BlockRef:
    return BlockRef(block_hash(parent, tokens), parent, position)


def test_allocate_takes_free_blocks_and_refcounts() -> None:
    bm = BlockManager(3, 4)
    ids = [bm.allocate() for _ in range(3)]
    assert sorted(ids) == [0, 1, 2]
    assert bm.num_free_blocks == 0 and bm.usage == 1.0
    assert not bm.can_allocate(1)
    bm.release(ids)
    assert bm.num_free_blocks == 3


def test_cached_block_survives_release_and_is_revived() -> None:
    bm = BlockManager(2, 4)
    b = bm.allocate()
    r = ref([1, 2, 3, 4])
    assert bm.register(b, r, [1, 2, 3, 4])
    bm.release([b])
    assert bm.num_free_blocks == 2 and bm.num_cached_blocks == 1
    assert bm.match([r.hash], [[1, 2, 3, 4]]) == [b]
    bm.acquire(b)
    bm.acquire(b)  # a second sequence shares it
    assert bm.blocks[b].ref_count == 2 and bm.num_free_blocks == 1
    bm.release([b])
    assert bm.num_free_blocks == 1  # still referenced once
    bm.release([b])
    assert bm.num_free_blocks == 2
    with pytest.raises(AssertionError):
        bm.release([b])


def test_eviction_prefers_never_used_blocks_then_least_recent() -> None:
    bm = BlockManager(4, 4)
    a, b, c = bm.allocate(), bm.allocate(), bm.allocate()
    refs = {x: ref([x] * 4) for x in (a, b, c)}
    for x in (a, b, c):
        bm.register(x, refs[x], [x] * 4)
    bm.release([a])
    bm.release([c])
    bm.release([b])  # LRU order now a, c, b
    assert bm.allocate() == 3  # the never-used block goes first
    assert bm.take_evictions() == []
    assert bm.allocate() == a
    assert bm.allocate() == c
    evicted = bm.take_evictions()
    assert [(e.block_id, e.ref) for e in evicted] == [(a, refs[a]), (c, refs[c])]
    assert bm.match([refs[a].hash], [[a] * 4]) == []  # gone from the index
    assert bm.match([refs[b].hash], [[b] * 4]) == [b]


def test_release_order_makes_chain_tails_evict_first() -> None:
    bm = BlockManager(3, 4)
    chain = [bm.allocate() for _ in range(3)]
    hashes = chain_hashes(ROOT, list(range(12)), 4)
    for i, block in enumerate(chain):
        parent = hashes[i - 1] if i else ROOT
        bm.register(block, BlockRef(hashes[i], parent, i), list(range(4 * i, 4 * i + 4)))
    bm.release(chain)
    assert bm.allocate() == chain[2]
    assert bm.take_evictions()[0].ref.position == 2


def test_hash_collision_is_caught_by_comparing_tokens() -> None:
    bm = BlockManager(2, 4)
    b = bm.allocate()
    r = ref([1, 2, 3, 4])
    bm.register(b, r, [1, 2, 3, 4])
    # Same key, different tokens (a forged collision): not a hit.
    assert bm.match([r.hash], [[9, 9, 9, 9]]) == []
    assert bm.match([r.hash], [[1, 2, 3, 4]]) == [b]


def test_duplicate_registration_keeps_the_first_block() -> None:
    bm = BlockManager(2, 4)
    a, b = bm.allocate(), bm.allocate()
    r = ref([5, 6, 7, 8])
    assert bm.register(a, r, [5, 6, 7, 8])
    assert not bm.register(b, r, [5, 6, 7, 8])
    bm.release([b])
    assert bm.num_cached_blocks == 1  # b went back to the plain free list


def test_match_stops_at_the_first_miss() -> None:
    bm = BlockManager(4, 2)
    tokens = [1, 2, 3, 4, 5, 6]
    hashes = chain_hashes(ROOT, tokens, 2)
    ids = [bm.allocate() for _ in range(3)]
    bm.register(ids[0], BlockRef(hashes[0], ROOT, 0), [1, 2])
    bm.register(ids[2], BlockRef(hashes[2], hashes[1], 2), [5, 6])
    assert bm.match(hashes, [[1, 2], [3, 4], [5, 6]]) == [ids[0]]


def test_tenant_namespace_salts_every_hash() -> None:
    tokens = list(range(8))
    a = chain_hashes(root_hash("tenant-a", "tiny", 4), tokens, 4)
    b = chain_hashes(root_hash("tenant-b", "tiny", 4), tokens, 4)
    assert len(a) == len(b) == 2
    assert not set(a) & set(b)
    assert chain_hashes(root_hash("tenant-a", "tiny", 4), tokens, 4) == a


def test_evict_cached_empties_the_cache_and_records_every_block() -> None:
    bm = BlockManager(3, 4)
    blocks = [bm.allocate() for _ in range(2)]
    for i, block in enumerate(blocks):
        bm.register(block, ref([i] * 4), [i] * 4)
    bm.release(blocks)
    assert bm.evict_cached() == 2
    assert {e.block_id for e in bm.take_evictions()} == set(blocks)
    assert bm.num_cached_blocks == 0 and bm.num_free_blocks == 3
