"""The engine's side of the sidecar: a :class:`~strata.worker.kv_connector.KVConnector` that
speaks the Unix-socket protocol (``link``) and moves block bytes through the shared-memory
slots (``copies``).

Never raises into the engine: when the sidecar is down, slow or confused, lookups miss, loads
return 0, saves are dropped, and the client retries the connection at most every
``retry_s`` seconds. Every block read is checked against its checksum before it is copied out;
a failing block ends the load there and is reported to the sidecar, which drops it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, cast

import torch

from strata.worker import kv_connector
from strata.worker.config import WorkerConfig
from strata.worker.kv_connector import BlockRef, KVConnector, Tier
from strata.worker.kvtier import protocol
from strata.worker.kvtier.blockcopy import COPY_THREADS, DEVICE_COPY_THREADS, warm_gpu_hash
from strata.worker.kvtier.copies import BlockCopies
from strata.worker.kvtier.link import SidecarLink
from strata.worker.kvtier.link import SidecarUnavailable as SidecarUnavailable
from strata.worker.tokenizer import load_tokenizer

log = logging.getLogger(__name__)


class TierClient:
    def __init__(
        self,
        socket_path: str,
        block_shape: tuple[int, ...],
        dtype: torch.dtype,
        timeout_s: float = 5.0,
        retry_s: float = 1.0,
        pins: Sequence[bytes] = (),
        threads: int = COPY_THREADS,
        gpu_hash: bool = True,
        direct_io: bool = True,
    ) -> None:
        self.socket_path = socket_path
        self.block_shape = block_shape
        self.dtype = dtype
        self.block_bytes = math.prod(block_shape) * torch.empty((), dtype=dtype).element_size()
        self.link = SidecarLink(socket_path, self.block_bytes, timeout_s, retry_s, pins, direct_io)
        self.copies = BlockCopies(self.link, self.block_bytes, threads, gpu_hash)
        self.corrupt_blocks = 0

    # ---- the tunables and counters of its parts ----

    @property
    def timeout_s(self) -> float:
        return self.link.timeout_s

    @property
    def retry_s(self) -> float:
        return self.link.retry_s

    @retry_s.setter
    def retry_s(self, seconds: float) -> None:
        self.link.retry_s = seconds

    @property
    def direct_io(self) -> bool:
        return self.link.direct_io

    @property
    def threads(self) -> int:
        return self.copies.threads

    @property
    def gpu_hash(self) -> bool:
        return self.copies.gpu_hash

    @property
    def direct_saved(self) -> int:
        return self.copies.direct_saved

    @direct_saved.setter
    def direct_saved(self, count: int) -> None:
        self.copies.direct_saved = count

    @property
    def direct_loaded(self) -> int:
        return self.copies.direct_loaded

    @property
    def unverified_blocks(self) -> int:
        return self.copies.unverified_blocks

    # ---- KVConnector ----

    def lookup(self, hashes: Sequence[bytes]) -> list[Tier]:
        if not hashes:
            return []
        reply = self.link.safe_call({"op": "lookup", "keys": [h.hex() for h in hashes]})
        return cast(list[Tier], reply["tiers"]) if reply else []

    def load(self, hashes: Sequence[bytes], out: Sequence[torch.Tensor]) -> int:
        if not hashes:
            return 0
        with self.link.lock:
            try:
                return self._load(hashes, out)
            except Exception as err:
                self.link.fail("load", err)
                return 0

    def save(self, blocks: Sequence[BlockRef], data: Sequence[torch.Tensor]) -> None:
        if not blocks:
            return
        with self.link.lock:
            try:
                self._save(blocks, data, checked=False)
            except Exception as err:
                self.link.fail("save", err)

    def prefetch(self, hashes: Sequence[bytes]) -> None:
        if hashes:
            self.link.safe_send({"op": "prefetch", "keys": [h.hex() for h in hashes]})

    def expect(self, request: str, hashes: Sequence[bytes]) -> None:
        if hashes:
            self.link.safe_send({"op": "expect", "request": request, "keys": [h.hex() for h in hashes]})

    def unexpect(self, requests: Sequence[str]) -> None:
        if requests:
            self.link.safe_send({"op": "unexpect", "requests": list(requests)})

    def close(self) -> None:
        self.link.close()
        self.copies.close()

    # ---- beyond the protocol ----

    def pin(self, hashes: Sequence[bytes]) -> bool:
        """Keep these blocks resident in DRAM (a system prompt's chain)."""
        return self.link.safe_call({"op": "pin", "keys": [h.hex() for h in hashes]}) is not None

    def stats(self) -> dict[str, Any] | None:
        return self.link.safe_call({"op": "stats"})

    # ---- the data path ----

    def _load(self, hashes: Sequence[bytes], out: Sequence[torch.Tensor]) -> int:
        """Ask for everything left: the sidecar answers with the leading blocks it could place
        in shared memory (all that DRAM holds; from lower tiers at most half the staging slots
        per answer) and, having answered, reads the next answer's blocks at once, while this
        one is copied out here (its read-ahead); this one's slots go back before the rest is
        asked for, so the read-ahead finds room. Stops when an answer brings nothing or a block
        fails its check (reported: the sidecar drops it, and gives back what it read ahead)."""
        count = min(len(hashes), len(out))
        direct = self.copies.direct_ok(out[:count])
        reply = self.link.call(self._get(hashes, 0, count, direct))
        loaded = 0
        while True:
            slots: list[int] = reply["slots"]
            if reply.get("nvme"):  # NVMe slots: read here, straight into the blocks
                intact = self.copies.read_direct(out[loaded:], reply)
                self.link.send_later({"op": "release", "slots": [], "nvme_slots": slots})
            else:
                intact = self.copies.copy_out(out[loaded:], reply)
                self.link.send_later({"op": "release", "slots": slots})
            loaded += intact
            if intact < len(slots):
                self._report_corrupt(hashes[loaded])
                return loaded
            if not slots or loaded >= count:
                return loaded
            reply = self.link.call_pipelined(self._get(hashes, loaded, count, direct))

    @staticmethod
    def _get(hashes: Sequence[bytes], start: int, stop: int, direct: bool) -> protocol.Message:
        get = {"op": "get", "keys": [h.hex() for h in hashes[start:stop]]}
        return get | {"direct": True} if direct else get

    def _report_corrupt(self, key: bytes) -> None:
        self.corrupt_blocks += 1
        log.warning("kvtier: block %s failed its checksum; recomputing", key.hex())
        self.link.call({"op": "corrupt", "keys": [key.hex()]})

    def save_checked(self, blocks: Sequence[BlockRef], data: Sequence[torch.Tensor]) -> int:
        """``save`` that raises :class:`SidecarUnavailable` (or OSError) instead of dropping, and
        returns how many blocks the sidecar committed (with write-through to a persistent NVMe
        tier: durable). Blocks the tiers already hold are not sent again. A failure ends the
        connection (the next call connects afresh): the slots this save reserved go back with
        it, and no reply it left unread is taken for a later call's."""
        with self.link.lock:
            try:
                return self._save(blocks, data, checked=True)
            except BaseException:
                self.link.disconnect()
                raise

    def _save(self, blocks: Sequence[BlockRef], data: Sequence[torch.Tensor], checked: bool) -> int:
        """Save in batches of a third of the sidecar's ``max_batch`` (``save_batches``): the
        next batch's slots are reserved before this one's put, so that the engine copies batch
        n+1 while the sidecar writes batch n down. Three batches' staging slots are taken at
        once: n-1's being committed, n's put on its way, n+1's reserve, so the sidecar queues
        n's writes behind n-1's without waiting for its slots (its reply to a reserve follows
        the put before it, committed). A checked save reads every put's reply and sums what
        was stored. A direct save (``BlockCopies.direct_ok``) holds no staging slots for the blocks it
        writes itself: its batches are the whole ``max_batch``."""
        sock = self.link.connected()
        if not blocks:
            return 0
        direct = self.copies.direct_ok(data)
        spans = save_batches(len(blocks), max(1, self.link.max_batch // (1 if direct else 3)))
        batches = [(blocks[start:stop], data[start:stop]) for start, stop in spans]
        self.link.drain(sock)
        self.link.stored = 0
        reserved = self.link.call(self._reserve(batches[0][0], direct))
        for n, (refs, tensors) in enumerate(batches):
            put = self._fill(refs, tensors, reserved)
            if n + 1 < len(batches):
                self.link.send_later(self._reserve(batches[n + 1][0], direct))
            self.link.send_later(put)
            if n + 1 < len(batches):
                reserved = self.link.reply_to(sock, "reserve")
        if checked:
            self.link.drain(sock)
        return self.link.stored

    @staticmethod
    def _reserve(blocks: Sequence[BlockRef], direct: bool) -> protocol.Message:
        reserve = {
            "op": "reserve",
            "keys": [b.hash.hex() for b in blocks],
            "parents": [b.parent.hex() for b in blocks],
        }
        return reserve | {"direct": True} if direct else reserve

    def _fill(
        self, blocks: Sequence[BlockRef], data: Sequence[torch.Tensor], reserved: dict[str, Any]
    ) -> protocol.Message:
        """Copy the blocks that got a slot into it, with the checksums the sidecar asked for
        taken along; the put that commits them."""
        slots: list[int | None] = reserved["slots"]
        wanted: list[bool] = reserved.get("hash") or [False] * len(slots)
        taken = [i for i, slot in enumerate(slots) if slot is not None]
        given = [cast(int, slots[i]) for i in taken]
        sums = self.copies.copy_in(given, [data[i] for i in taken], [wanted[i] for i in taken])
        put = {
            "op": "put",
            "keys": [blocks[i].hash.hex() for i in taken],
            "parents": [blocks[i].parent.hex() for i in taken],
            "slots": given,
        }
        put |= self.copies.write_direct(data, reserved.get("nvme"))
        return put | {"checksums": sums} if any(s is not None for s in sums) else put


def save_batches(count: int, size: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of a save's batches of at most ``size`` blocks, the first a quarter of
    that: nothing is written down while the first batch is copied, so a short one starts the
    disk sooner; the later ones overlap their copies with the writes before them."""
    if count <= 0:
        return []
    first = min(count, max(1, size // 4))
    return [(0, first)] + [(i, min(i + size, count)) for i in range(first, count, size)]


def connect(
    config: WorkerConfig, block_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | None = None
) -> KVConnector:
    """The engine's connector to the sidecar named in ``config.kvtier`` (lazy: connects on
    first use, so the engine may start before the sidecar), for an engine on ``device``.
    ``kvtier.pinned_prefixes`` are tokenized with the model's tokenizer and their full blocks
    pinned in DRAM."""
    pins: list[bytes] = []
    if config.kvtier.pinned_prefixes:
        tokenizer = load_tokenizer(config.model.path)
        for text in config.kvtier.pinned_prefixes:
            pins += pinned_hashes(config, tokenizer.encode(text))
    threads = client_threads(device)
    gpu_hash = config.kvtier.gpu_checksums
    client = TierClient(
        config.kvtier.socket_path, tuple(block_shape), dtype, pins=pins, threads=threads, gpu_hash=gpu_hash
    )
    if gpu_hash and device is not None and device.type == "cuda":
        warm_gpu_hash(device, client.block_bytes)  # compiled now, not on the first request
    return client


def client_threads(device: torch.device | None) -> int:
    """Threads for a client of an engine on ``device``: more on CUDA, where they only hash."""
    return DEVICE_COPY_THREADS if device is not None and device.type == "cuda" else COPY_THREADS


def pinned_hashes(config: WorkerConfig, token_ids: Sequence[int]) -> list[bytes]:
    """The chain of a pinned prefix's full blocks, as the engine hashes them."""
    block_size = config.engine.block_size
    root = kv_connector.root_hash(config.cache_namespace, config.model.name, block_size)
    return kv_connector.chain_hashes(root, token_ids, block_size)
