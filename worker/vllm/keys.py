"""The KV-tier keys of blocks a vLLM engine computes: the same chain as the built-in engine's
(``kv_connector.chain_hashes``), from a root of their own.

vLLM's own block hashes depend on its hash algorithm and a per-process seed, so Strata never
uses them as keys. Its connector, the KV-event relay and the router all chain the blocks' token
ids from :func:`vllm_root` instead, and agree with no shared state. The root takes in what vLLM
mixes into a first block's hash besides the tokens: the request's ``cache_salt`` (where it is not
the service's cache namespace, which the router sets by default) and its LoRA adapter. Torch-free:
the router imports it.
"""

from __future__ import annotations

import hashlib

from strata.worker.kv_connector import HASH_BYTES, BlockRef, root_hash

ENGINE = "vllm"


def vllm_root(
    cache_namespace: str,
    model: str,
    block_size: int,
    device: str,
    *,
    salt: str | None = None,
    lora: str | None = None,
) -> bytes:
    """The parent of the first block of a request to a vLLM engine on ``device`` (``cpu`` or
    ``cuda``: each attention backend packs its cache its own way, so blocks never cross)."""
    engine = f"{ENGINE}/{device}"
    if salt and salt != cache_namespace:
        engine += f"\0salt={salt}"
    if lora:
        engine += f"\0lora={lora}"
    return root_hash(cache_namespace, model, block_size, engine)


def rank_key(key: bytes, rank: int) -> bytes:
    """Tensor-parallel rank ``rank``'s key of the block whose rank-0 key is ``key``: each rank
    holds its own share of the heads, under a key of its own. Rank 0's is the key itself, the
    one the scheduler looks up and the router routes on (the ranks save and load together)."""
    if not rank:
        return key
    return hashlib.blake2b(key + rank.to_bytes(4, "little"), digest_size=HASH_BYTES).digest()


def rank_ref(ref: BlockRef, rank: int) -> BlockRef:
    return BlockRef(rank_key(ref.hash, rank), rank_key(ref.parent, rank), ref.position) if rank else ref
