"""vLLM's KV-cache events as changes to the set of Strata keys its HBM holds (pure).

vLLM publishes, over ZMQ, batches of ``BlockStored`` (vLLM's hashes of new full blocks, their
parent's hash, their token ids, the extra keys mixed into their hashes), ``BlockRemoved`` and
``AllBlocksCleared`` (decoded from msgpack into plain dicts). :class:`EngineBlocks` chains each
stored block's tokens from its parent's Strata key (``keys.vllm_root`` for a first block), so
the keys it reports are the ones the connector saves under and the router looks up. A block
whose parent it never saw (events missed) is skipped, and so are its descendants in the batch:
an unknown block only makes the router undervalue a replica, a wrong one would mislead it.
Several vLLM blocks can share one Strata key (the same tokens with and without the service's
default salt), so keys are counted and reported stored once and removed once.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from strata.worker.kv_connector import block_hash

log = logging.getLogger(__name__)
HBM_MEDIA = (None, "GPU")  # vLLM's own CPU offloading reports medium "CPU": not HBM
VllmHash = bytes | int
RootOf = Callable[[str | None, str | None], bytes]  # (salt, lora) -> root key


@dataclass
class Changes:
    """What one batch changed, in Strata keys."""

    stored: list[bytes] = field(default_factory=list)
    removed: list[bytes] = field(default_factory=list)
    cleared: bool = False


@dataclass
class EngineBlocks:
    """The Strata keys of the blocks one vLLM engine holds, from its events."""

    root_of: RootOf
    block_size: int
    keys: dict[VllmHash, bytes] = field(default_factory=dict)
    counts: Counter[bytes] = field(default_factory=Counter)
    skipped: int = 0  # stored blocks whose parent was unknown

    def apply(self, events: Iterable[dict[str, Any]]) -> Changes:
        changes = Changes()
        for event in events:
            kind = event.get("type")
            if kind == "BlockStored":
                self._stored(event, changes)
            elif kind == "BlockRemoved":
                self._removed(event, changes)
            elif kind == "AllBlocksCleared":
                changes.removed += self.clear()
                changes.cleared = True
        return changes

    def clear(self) -> list[bytes]:
        """Forget every block (the engine restarted, or cleared its cache); the keys it held."""
        held = list(self.counts)
        self.keys.clear()
        self.counts.clear()
        return held

    def _stored(self, event: dict[str, Any], changes: Changes) -> None:
        if not _hbm(event) or event.get("block_size", self.block_size) != self.block_size:
            return
        hashes: Sequence[VllmHash] = event.get("block_hashes") or []
        tokens: Sequence[int] = event.get("token_ids") or []
        parent = self._parent(event)
        for i, vllm_hash in enumerate(hashes):
            block = tokens[i * self.block_size : (i + 1) * self.block_size]
            if parent is None or len(block) != self.block_size:
                self.skipped += len(hashes) - i
                return
            parent = block_hash(parent, block)
            self._add(vllm_hash, parent, changes)

    def _parent(self, event: dict[str, Any]) -> bytes | None:
        parent = event.get("parent_block_hash")
        if parent is not None:
            return self.keys.get(parent)
        extra = (event.get("extra_keys") or [None])[0]
        salt = _salt(extra, event.get("lora_name"))
        if salt is _MULTIMODAL:
            return None  # image tokens: the token ids alone do not say what the block holds
        return self.root_of(salt if isinstance(salt, str) else None, event.get("lora_name"))

    def _add(self, vllm_hash: VllmHash, key: bytes, changes: Changes) -> None:
        if vllm_hash in self.keys:
            return
        self.keys[vllm_hash] = key
        self.counts[key] += 1
        if self.counts[key] == 1:
            changes.stored.append(key)

    def _removed(self, event: dict[str, Any], changes: Changes) -> None:
        if not _hbm(event):
            return
        for vllm_hash in event.get("block_hashes") or []:
            key = self.keys.pop(vllm_hash, None)
            if key is None:
                continue
            self.counts[key] -= 1
            if self.counts[key] <= 0:
                del self.counts[key]
                changes.removed.append(key)


_MULTIMODAL = object()


def _hbm(event: dict[str, Any]) -> bool:
    return event.get("medium") in HBM_MEDIA and event.get("group_idx") in (None, 0)


def _salt(extra: Sequence[Any] | None, lora: str | None) -> object:
    """The cache salt among a first block's extra keys (the LoRA name first, where there is one;
    multimodal entries are pairs), or _MULTIMODAL where the block holds image tokens."""
    salt: object = None
    for i, key in enumerate(extra or ()):
        if isinstance(key, list | tuple):
            return _MULTIMODAL
        if i == 0 and lora is not None and key == lora:
            continue
        if isinstance(key, str):
            salt = key
    return salt
