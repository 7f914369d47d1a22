"""vLLM's KV events as Strata keys: chained from the tokens, so they match the connector's keys."""

from __future__ import annotations

from typing import Any

from strata.worker.kv_connector import chain_hashes
from strata.worker.vllm.events import EngineBlocks
from strata.worker.vllm.keys import vllm_root

NS, MODEL, BS = "tenant.uid", "m", 4


def root_of(salt: str | None, lora: str | None) -> bytes:
    return vllm_root(NS, MODEL, BS, "cpu", salt=salt, lora=lora)


def stored(hashes: list[Any], parent: Any, tokens: list[int], **extra: Any) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": BS, "medium": "GPU", **extra}  # fmt: skip


def test_stored_blocks_get_the_keys_the_connector_chains() -> None:
    blocks = EngineBlocks(root_of, BS)
    tokens = list(range(12))
    first = blocks.apply([stored([b"a", b"b"], None, tokens[:8])])
    second = blocks.apply([stored([7], b"b", tokens[8:12])])
    expected = chain_hashes(vllm_root(NS, MODEL, BS, "cpu"), tokens, BS)
    assert first.stored + second.stored == expected


def test_a_block_whose_parent_was_never_seen_is_skipped_with_its_descendants() -> None:
    blocks = EngineBlocks(root_of, BS)
    changes = blocks.apply([stored([b"c", b"d"], b"unknown", list(range(8)))])
    assert changes.stored == [] and blocks.skipped == 2


def test_keys_shared_by_two_vllm_blocks_are_removed_when_the_last_goes() -> None:
    blocks = EngineBlocks(root_of, BS)
    tokens = [1, 2, 3, 4]
    assert blocks.apply([stored([b"x"], None, tokens)]).stored
    # the same tokens under the service's default salt: another vLLM hash, the same Strata key
    assert blocks.apply([stored([b"y"], None, tokens, extra_keys=[(NS,)])]).stored == []
    assert blocks.apply([{"type": "BlockRemoved", "block_hashes": [b"x"], "medium": "GPU"}]).removed == []
    gone = blocks.apply([{"type": "BlockRemoved", "block_hashes": [b"y"], "medium": "GPU"}])
    assert gone.removed == chain_hashes(vllm_root(NS, MODEL, BS, "cpu"), tokens, BS)


def test_a_salt_of_the_clients_own_gives_other_keys() -> None:
    blocks = EngineBlocks(root_of, BS)
    plain = blocks.apply([stored([b"p"], None, [1, 2, 3, 4])]).stored
    salted = blocks.apply([stored([b"s"], None, [1, 2, 3, 4], extra_keys=[("alice",)])]).stored
    assert salted == chain_hashes(vllm_root(NS, MODEL, BS, "cpu", salt="alice"), [1, 2, 3, 4], BS) != plain


def test_other_media_groups_and_multimodal_blocks_are_not_hbm_blocks() -> None:
    blocks = EngineBlocks(root_of, BS)
    assert not blocks.apply([stored([b"c"], None, [1, 2, 3, 4], medium="CPU")]).stored
    assert not blocks.apply([stored([b"g"], None, [1, 2, 3, 4], group_idx=1)]).stored
    assert not blocks.apply([stored([b"i"], None, [1, 2, 3, 4], extra_keys=[(("img", 0),)])]).stored


def test_all_blocks_cleared_removes_every_key() -> None:
    blocks = EngineBlocks(root_of, BS)
    held = blocks.apply([stored([b"a", b"b"], None, list(range(8)))]).stored
    changes = blocks.apply([{"type": "AllBlocksCleared"}])
    assert changes.cleared and sorted(changes.removed) == sorted(held) and not blocks.keys
