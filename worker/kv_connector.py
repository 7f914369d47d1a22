"""The contract between the engine's HBM prefix cache and the KV-tier sidecar.

The engine (``strata.worker.engine``) owns device memory and the HBM prefix cache; the KV-tier
client (``strata.worker.kvtier``) implements :class:`KVConnector`. On HBM eviction the engine
hands the victim blocks to ``save``; on an HBM prefix miss it asks ``lookup`` and ``load``s what
the lower tiers hold; while requests wait in its queue it announces them (``expect``) so that
their blocks are kept and start moving up from NVMe/shared before they are needed.

A block is identified by its chained hash: ``block_hash(parent, tokens)`` where the first
block's parent is ``root_hash(cache_namespace, model)``. The namespace salt means two tenants
never produce the same key, so no tier can ever serve one tenant's blocks to another.
A block's data is one contiguous tensor of shape ``[num_layers, 2, block_size, num_kv_heads,
head_dim]`` (K then V), in the KV dtype; its byte size is fixed per engine (``block_bytes``).
A host engine's blocks of whole pages start on a page (``PAGE``), so that the tiers can move
them to and from the disk directly.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

# Part of this contract; defined in strata.common, with what the other planes share.
from strata.common.blocks import PAGE as PAGE
from strata.common.tiers import Tier as Tier

if TYPE_CHECKING:
    import torch

HASH_BYTES = 16


def root_hash(cache_namespace: str, model: str, block_size: int, engine: str = "") -> bytes:
    """The parent of a sequence's first block: salts every chain with tenant and model, and with
    ``engine`` where it is not the built-in one (whose blocks another engine must never load)."""
    text = f"strata-kv-v1\0{cache_namespace}\0{model}\0{block_size}"
    if engine:
        text += f"\0{engine}"
    return hashlib.blake2b(text.encode(), digest_size=HASH_BYTES).digest()


def block_hash(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """Hash of a full block: its parent's hash chained with its token ids."""
    h = hashlib.blake2b(parent, digest_size=HASH_BYTES)
    h.update(struct.pack(f"<{len(token_ids)}i", *token_ids))
    return h.digest()


def chain_hashes(root: bytes, token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """Hashes of every full block of ``token_ids`` (a trailing partial block has none)."""
    hashes: list[bytes] = []
    parent = root
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = block_hash(parent, token_ids[start : start + block_size])
        hashes.append(parent)
    return hashes


@dataclass(frozen=True)
class BlockRef:
    """A full block offered to the tiers: its key, its parent's key and its position in the chain."""

    hash: bytes
    parent: bytes
    position: int  # 0 for the first block of a sequence


class KVConnector(Protocol):
    """What the engine needs from the lower KV tiers. All methods are safe to call when the
    sidecar is down: they then report misses and drop saves, and the engine recomputes."""

    def lookup(self, hashes: Sequence[bytes]) -> list[Tier]:
        """Tiers holding the longest run of leading ``hashes`` (stops at the first miss)."""
        ...

    def load(self, hashes: Sequence[bytes], out: Sequence[torch.Tensor]) -> int:
        """Copy block ``i`` into ``out[i]``; return how many leading blocks arrived intact."""
        ...

    def save(self, blocks: Sequence[BlockRef], data: Sequence[torch.Tensor]) -> None:
        """Offer blocks leaving HBM (or, write-through, just computed). The data is copied before
        returning, so the engine may reuse the device blocks at once. Tiers may decline."""
        ...

    def prefetch(self, hashes: Sequence[bytes]) -> None:
        """Hint that these blocks will be loaded soon: start moving them up to DRAM."""
        ...

    def expect(self, request: str, hashes: Sequence[bytes]) -> None:
        """Look-ahead: queued request ``request`` will load these blocks. Keep them (no
        eviction, always admitted) and move them up, until ``unexpect``."""
        ...

    def unexpect(self, requests: Sequence[str]) -> None:
        """Those queued requests were scheduled, or left."""
        ...

    def close(self) -> None: ...
