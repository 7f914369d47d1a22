"""The engine's side of the sidecar: a :class:`~strata.worker.kv_connector.KVConnector` that
speaks the Unix-socket protocol and moves block bytes through the shared-memory slots.

Never raises into the engine: when the sidecar is down, slow or confused, lookups miss, loads
return 0, saves are dropped, and the client retries the connection at most every
``retry_s`` seconds. Every block read is checked against its checksum before it is copied out;
a failing block ends the load there and is reported to the sidecar, which drops it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

import torch

from strata.worker import kv_connector
from strata.worker.config import WorkerConfig
from strata.worker.kv_connector import BlockRef, KVConnector, Tier
from strata.worker.kvtier import protocol
from strata.worker.kvtier.arena import SlotArena
from strata.worker.kvtier.blockcopy import (
    COPY_THREADS,
    DEVICE_COPY_THREADS,
    copy_blocks,
    copy_hashing_addresses,
    flat_bytes,
    host_sources,
    save_blocks,
    warm_gpu_hash,
)
from strata.worker.kvtier.blockio import HASH_THREADS, direct_ready, read_blocks, write_blocks
from strata.worker.kvtier.pagelock import page_lock, page_unlock
from strata.worker.tokenizer import load_tokenizer

log = logging.getLogger(__name__)
Pair = tuple[torch.Tensor, torch.Tensor]  # (destination, source) of one block copy


class SidecarUnavailable(Exception):
    """The sidecar did not answer; the caller degrades to a miss."""


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
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self._lock = threading.RLock()
        self._sock: socket.socket | None = None
        self._arena: SlotArena | None = None
        self._slots: torch.Tensor | None = None  # uint8 view over the whole arena
        self._page_locked = False  # registered with CUDA: device copies are DMA
        self._retry_at = 0.0
        self._max_batch = 1
        self._down = False
        # Copies and checksums of a batch in parallel: memmove, the compiled hash and torch's
        # copies release the GIL. (From a GPU the copy engine copies and these threads hash.)
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="kvtier-client")
        # Blocks on a GPU hashed by the GPU (where Triton can): no host thread reads them.
        self.gpu_hash = gpu_hash
        # Blocks only NVMe takes written by this process straight from the KV cache (host
        # blocks on whole pages, where the sidecar offers it: ``direct``), no staging copy.
        self.direct_io = direct_io
        self._direct_fd: int | None = None  # the NVMe data file, passed by the sidecar
        # Its reads and writes, as many at once as the sidecar's own (the NVMe tier's
        # ``io_threads``: the same queue depth), while ``_hasher`` hashes the blocks.
        self._io: ThreadPoolExecutor | None = None
        self._hasher = ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="kvtier-hash")
        self._io_depth = 0
        self._nvme_slot_bytes = 0
        self.direct_saved = self.direct_loaded = 0  # blocks that went that way
        self._pins = list(pins)  # re-sent on every connect: a restarted sidecar forgets them
        self._outstanding: deque[str] = deque()  # ops sent whose replies are still to be read
        self._stored = 0  # blocks the puts of the current save stored, by their replies
        self.corrupt_blocks = 0
        # Loaded without a checksum to compare: verified by the sidecar as it read them from a
        # lower tier, or saved into DRAM moments before (the sidecar had not sealed them yet).
        self.unverified_blocks = 0

    # ---- KVConnector ----

    def lookup(self, hashes: Sequence[bytes]) -> list[Tier]:
        if not hashes:
            return []
        reply = self._safe_call({"op": "lookup", "keys": [h.hex() for h in hashes]})
        return cast(list[Tier], reply["tiers"]) if reply else []

    def load(self, hashes: Sequence[bytes], out: Sequence[torch.Tensor]) -> int:
        if not hashes:
            return 0
        with self._lock:
            try:
                return self._load(hashes, out)
            except Exception as err:
                self._fail("load", err)
                return 0

    def save(self, blocks: Sequence[BlockRef], data: Sequence[torch.Tensor]) -> None:
        if not blocks:
            return
        with self._lock:
            try:
                self._save(blocks, data, checked=False)
            except Exception as err:
                self._fail("save", err)

    def prefetch(self, hashes: Sequence[bytes]) -> None:
        if hashes:
            self._safe_send({"op": "prefetch", "keys": [h.hex() for h in hashes]})

    def expect(self, request: str, hashes: Sequence[bytes]) -> None:
        if hashes:
            self._safe_send({"op": "expect", "request": request, "keys": [h.hex() for h in hashes]})

    def unexpect(self, requests: Sequence[str]) -> None:
        if requests:
            self._safe_send({"op": "unexpect", "requests": list(requests)})

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                with contextlib.suppress(Exception):  # the last puts land before we go
                    self._drain(self._sock)
            self._disconnect()
        self._pool.shutdown(wait=False)
        self._hasher.shutdown(wait=False)
        if self._io is not None:
            self._io.shutdown(wait=False)

    # ---- beyond the protocol ----

    def pin(self, hashes: Sequence[bytes]) -> bool:
        """Keep these blocks resident in DRAM (a system prompt's chain)."""
        return self._safe_call({"op": "pin", "keys": [h.hex() for h in hashes]}) is not None

    def stats(self) -> dict[str, Any] | None:
        return self._safe_call({"op": "stats"})

    # ---- the data path ----

    def _load(self, hashes: Sequence[bytes], out: Sequence[torch.Tensor]) -> int:
        """Ask for everything left: the sidecar answers with the leading blocks it could place
        in shared memory (all that DRAM holds; from lower tiers at most half the staging slots
        per answer) and, having answered, reads the next answer's blocks at once, while this
        one is copied out here (its read-ahead); this one's slots go back before the rest is
        asked for, so the read-ahead finds room. Stops when an answer brings nothing or a block
        fails its check (reported: the sidecar drops it, and gives back what it read ahead)."""
        count = min(len(hashes), len(out))
        direct = self._direct_ok(out[:count])
        reply = self._call(self._get(hashes, 0, count, direct))
        loaded = 0
        while True:
            slots: list[int] = reply["slots"]
            if reply.get("nvme"):  # NVMe slots: read here, straight into the blocks
                intact = self._read_direct(out[loaded:], reply)
                self._send_later({"op": "release", "slots": [], "nvme_slots": slots})
            else:
                intact = self._copy_out(out[loaded:], reply)
                self._send_later({"op": "release", "slots": slots})
            loaded += intact
            if intact < len(slots):
                self._report_corrupt(hashes[loaded])
                return loaded
            if not slots or loaded >= count:
                return loaded
            reply = self._call_pipelined(self._get(hashes, loaded, count, direct))

    @staticmethod
    def _get(hashes: Sequence[bytes], start: int, stop: int, direct: bool) -> protocol.Message:
        get = {"op": "get", "keys": [h.hex() for h in hashes[start:stop]]}
        return get | {"direct": True} if direct else get

    def _read_direct(self, out: Sequence[torch.Tensor], reply: dict[str, Any]) -> int:
        """Read an answer's NVMe slots into the blocks, each checked as it is read (by the
        descriptor ``direct_io`` passed); how many leading ones are intact."""
        assert self._direct_fd is not None, "the sidecar names NVMe slots only to a direct_io client"
        slots: list[int] = reply["slots"]
        expected: list[int | None] = reply["checksums"]
        stride = self._nvme_slot_bytes
        reads = [(out[i].data_ptr(), slot * stride) for i, slot in enumerate(slots)]
        assert self._io is not None
        sums = read_blocks(self._io, self._hasher, self._direct_fd, reads, self.block_bytes)
        intact = [got is not None and got == want for got, want in zip(sums, expected, strict=True)]
        count = intact.index(False) if False in intact else len(intact)
        self.direct_loaded += count
        return count

    def _copy_out(self, out: Sequence[torch.Tensor], reply: dict[str, Any]) -> int:
        """Copy an answer's blocks out, checking them as they go; how many leading ones are intact."""
        slots: list[int] = reply["slots"]
        expected: list[int | None] = reply["checksums"]
        checked = any(want is not None for want in expected)  # nothing to check: a plain copy
        targets = host_sources(out[: len(slots)], self.block_bytes) if checked else None
        if targets is not None:  # every block in host memory: copied by address
            sums: list[int | None] = list(self._copy_by_address(slots, targets, into_slots=False))
        else:
            pairs = [(flat_bytes(out[i]), self._raw(slot)) for i, slot in enumerate(slots)]
            sums = list(self._copy(pairs, hashed=checked)) or list(expected)
        intact = [want is None or got == want for got, want in zip(sums, expected, strict=True)]
        self.unverified_blocks += expected.count(None)
        return intact.index(False) if False in intact else len(intact)

    def _report_corrupt(self, key: bytes) -> None:
        self.corrupt_blocks += 1
        log.warning("kvtier: block %s failed its checksum; recomputing", key.hex())
        self._call({"op": "corrupt", "keys": [key.hex()]})

    def save_checked(self, blocks: Sequence[BlockRef], data: Sequence[torch.Tensor]) -> int:
        """``save`` that raises :class:`SidecarUnavailable` (or OSError) instead of dropping, and
        returns how many blocks the sidecar committed (with write-through to a persistent NVMe
        tier: durable). Blocks the tiers already hold are not sent again. A failure ends the
        connection (the next call connects afresh): the slots this save reserved go back with
        it, and no reply it left unread is taken for a later call's."""
        with self._lock:
            try:
                return self._save(blocks, data, checked=True)
            except BaseException:
                self._disconnect()
                raise

    def _save(self, blocks: Sequence[BlockRef], data: Sequence[torch.Tensor], checked: bool) -> int:
        """Save in batches of a third of the sidecar's ``max_batch`` (``save_batches``): the
        next batch's slots are reserved before this one's put, so that the engine copies batch
        n+1 while the sidecar writes batch n down. Three batches' staging slots are taken at
        once: n-1's being committed, n's put on its way, n+1's reserve, so the sidecar queues
        n's writes behind n-1's without waiting for its slots (its reply to a reserve follows
        the put before it, committed). A checked save reads every put's reply and sums what
        was stored. A direct save (``_direct_ok``) holds no staging slots for the blocks it
        writes itself: its batches are the whole ``max_batch``."""
        sock = self._connected()
        if not blocks:
            return 0
        direct = self._direct_ok(data)
        spans = save_batches(len(blocks), max(1, self._max_batch // (1 if direct else 3)))
        batches = [(blocks[start:stop], data[start:stop]) for start, stop in spans]
        self._drain(sock)
        self._stored = 0
        reserved = self._call(self._reserve(batches[0][0], direct))
        for n, (refs, tensors) in enumerate(batches):
            put = self._fill(refs, tensors, reserved)
            if n + 1 < len(batches):
                self._send_later(self._reserve(batches[n + 1][0], direct))
            self._send_later(put)
            if n + 1 < len(batches):
                reserved = self._reply_to(sock, "reserve")
        if checked:
            self._drain(sock)
        return self._stored

    def _direct_ok(self, data: Sequence[torch.Tensor]) -> bool:
        """Whether this save's blocks may be written to NVMe by this process: direct I/O
        granted, and every block in host memory on whole pages."""
        if self._direct_fd is None:
            return False
        addresses = host_sources(data, self.block_bytes)
        return addresses is not None and direct_ready(addresses, self.block_bytes)

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
        tensors = [data[i] for i in taken]
        sources = host_sources(tensors, self.block_bytes)
        if sources is not None:  # every block in host memory: copied by address
            sums: list[int | None] = list(self._copy_by_address(given, sources, into_slots=True))
        else:
            sums = self._save_from_device(tensors, given, [wanted[i] for i in taken])
        put = {
            "op": "put",
            "keys": [blocks[i].hash.hex() for i in taken],
            "parents": [blocks[i].parent.hex() for i in taken],
            "slots": given,
        }
        put |= self._write_direct(data, reserved.get("nvme"))
        return put | {"checksums": sums} if any(s is not None for s in sums) else put

    def _write_direct(self, data: Sequence[torch.Tensor], nvme: list[int | None] | None) -> protocol.Message:
        """Write the blocks the reserve gave NVMe slots (``_direct_ok`` blocks) into them,
        each hashed beside its write: the put's fields that commit them."""
        chosen = [(i, slot) for i, slot in enumerate(nvme or []) if slot is not None]
        if not chosen or self._direct_fd is None:
            return {}
        stride = self._nvme_slot_bytes
        writes = [(data[i].data_ptr(), slot * stride) for i, slot in chosen]
        assert self._io is not None
        sums = write_blocks(self._io, self._hasher, self._direct_fd, writes, self.block_bytes)
        self.direct_saved += len(chosen)
        return {"nvme_slots": [slot for _, slot in chosen], "nvme_checksums": sums}

    def _copy(self, pairs: Sequence[Pair], hashed: bool) -> list[int]:
        """Copy a load's pairs out of the slots (device blocks, or host blocks unchecked); with
        ``hashed``, the checksums of the slots (read from) taken along."""
        return copy_blocks(self._pool, pairs, hashed, self._page_locked, self.gpu_hash, stream=True)

    def _copy_by_address(self, slots: Sequence[int], blocks: Sequence[int], into_slots: bool) -> list[int]:
        """Copy host blocks at the addresses ``blocks`` into ``slots`` (a save) or out of them
        (a load), each hashed along its copy (the checksums of the bytes copied), by address:
        flat views of each block and its slot would cost 7-9 us a block. With streaming stores
        both ways: the engine does not read its saved blocks back from the slots, and the
        sidecar writes them to NVMe by DMA; a load is mostly far more than a cache holds. So a
        cached store would only read every destination line from memory first (a load ran at
        1.04-1.38x the rate of cached stores, docs/kvtier-measurements.md)."""
        assert self._slots is not None and self._arena is not None
        base, stride = self._slots.data_ptr(), self._arena.slot_bytes
        size = self.block_bytes
        pairs = [(base + slot * stride, block) for slot, block in zip(slots, blocks, strict=True)]
        copies = [(slot, block, size) if into_slots else (block, slot, size) for slot, block in pairs]
        return copy_hashing_addresses(self._pool, copies, stream=True)

    def _save_from_device(
        self, tensors: Sequence[torch.Tensor], slots: Sequence[int], wanted: Sequence[bool]
    ) -> list[int | None]:
        """Copy device blocks into ``slots`` (DMA into the page-locked mapping); the checksums
        of every block, by the GPU, where it hashes them (``gpu_hash``); else of the slots the
        sidecar asked for (its staging ones), None for the others (the sidecar seals them)."""
        pairs = [(self._raw(s), flat_bytes(t)) for s, t in zip(slots, tensors, strict=True)]
        return save_blocks(self._pool, pairs, wanted, self._page_locked, self.gpu_hash)

    def _raw(self, slot: int) -> torch.Tensor:
        assert self._slots is not None and self._arena is not None
        start = slot * self._arena.slot_bytes
        return self._slots[start : start + self.block_bytes]

    # ---- connection ----

    def _safe_call(self, message: protocol.Message) -> dict[str, Any] | None:
        with self._lock:
            try:
                return self._call(message)
            except Exception as err:
                self._fail(str(message.get("op")), err)
                return None

    def _safe_send(self, message: protocol.Message) -> None:
        """A hint: sent without waiting; a failure shows up (and is handled) like any other."""
        with self._lock:
            try:
                self._send_later(message)
            except Exception as err:
                self._fail(str(message.get("op")), err)

    def _call(self, message: protocol.Message) -> dict[str, Any]:
        sock = self._connected()
        self._drain(sock)
        protocol.send(sock, protocol.tagged(message))
        return self._reply(sock, str(message.get("op")))

    def _call_pipelined(self, message: protocol.Message) -> dict[str, Any]:
        """``_call`` without waiting for the replies still due first: they are read after
        the message is sent, in order, so it costs no extra round trip."""
        self._send_later(message)
        return self._reply_to(self._connected(), str(message.get("op")))

    def _send_later(self, message: protocol.Message) -> None:
        """Send without waiting for the reply (a release, a save's put): it is read before the
        next call's, so the engine does not wait a round trip for what it does not need."""
        sock = self._connected()
        protocol.send(sock, protocol.tagged(message))
        self._outstanding.append(str(message.get("op")))

    def _drain(self, sock: socket.socket) -> None:
        while self._outstanding:
            self._reply_to(sock, self._outstanding[0])

    def _reply_to(self, sock: socket.socket, op: str) -> dict[str, Any]:
        """Read the replies to what was sent, in order, up to the first to an ``op`` (puts'
        stored counts summed into ``_stored``)."""
        while self._outstanding:
            sent = self._outstanding.popleft()
            reply = self._reply(sock, sent)
            self._stored += int(reply.get("stored", 0)) if sent == "put" else 0
            if sent == op:
                return reply
        raise SidecarUnavailable(f"no {op} was waiting for its reply")

    def _reply(self, sock: socket.socket, op: str) -> dict[str, Any]:
        reply = protocol.receive(sock)
        if reply is None:
            raise SidecarUnavailable("sidecar closed the connection")
        if not reply.get("ok"):
            raise SidecarUnavailable(f"sidecar refused {op}: {reply.get('error')}")
        return reply

    def _connected(self) -> socket.socket:
        if self._sock is not None:
            return self._sock
        if time.monotonic() < self._retry_at:
            raise SidecarUnavailable("sidecar down; retrying later")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout_s)
        try:
            sock.connect(self.socket_path)
            protocol.send(sock, {"op": "hello", "block_bytes": self.block_bytes})
            hello = protocol.receive(sock)
            if not hello or not hello.get("ok"):
                raise SidecarUnavailable(f"hello refused: {hello and hello.get('error')}")
            self._map(hello)
            if self.direct_io and hello.get("direct_io"):
                self._take_direct_io(sock)
            if self._pins:
                protocol.send(sock, {"op": "pin", "keys": [h.hex() for h in self._pins]})
                protocol.receive(sock)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        if self._down:
            log.info("kvtier: sidecar reachable again")
        self._down = False
        return sock

    def _map(self, hello: dict[str, Any]) -> None:
        """Map the sidecar's slots (afresh: a restarted sidecar may have re-created the file)."""
        self._unmap()
        self._arena = SlotArena(hello["shm_path"], hello["slot_bytes"], hello["num_slots"], create=False)
        self._slots = torch.frombuffer(self._arena.mmap, dtype=torch.uint8)
        self._page_locked = page_lock(self._slots, hello["shm_path"])
        self._max_batch = max(1, int(hello.get("max_batch", 1)))

    def _take_direct_io(self, sock: socket.socket) -> None:
        """Ask for the NVMe data file (passed with the reply); without it, saves stage."""
        fds: list[int] = []
        protocol.send(sock, {"op": "direct_io"})
        reply = protocol.receive(sock, fds)
        if reply is not None and reply.get("ok") and len(fds) == 1:
            self._direct_fd, self._nvme_slot_bytes = fds.pop(), int(reply["slot_bytes"])
            self._direct_threads(int(reply["io_threads"]))
        else:
            log.info("kvtier: no direct NVMe I/O: %s", reply and reply.get("error"))
        for fd in fds:
            os.close(fd)

    def _direct_threads(self, depth: int) -> None:
        """Threads for the direct I/O, as many as the sidecar's (a restarted one may differ)."""
        if self._io is not None and self._io_depth != depth:
            self._io.shutdown(wait=False)
            self._io = None
        if self._io is None:
            self._io, self._io_depth = ThreadPoolExecutor(depth, thread_name_prefix="kvtier-direct"), depth

    def _unmap(self) -> None:
        if self._page_locked and self._slots is not None:
            page_unlock(self._slots)
        self._page_locked = False
        self._slots = None
        if self._direct_fd is not None:
            os.close(self._direct_fd)
            self._direct_fd = None
        if self._arena is not None:
            with contextlib.suppress(BufferError):  # a tensor view still alive; the mapping goes with it
                self._arena.close()
            self._arena = None

    def _fail(self, op: str, err: Exception) -> None:
        if not self._down:  # once per outage, not once per call
            log.warning("kvtier: %s failed, degrading to recomputation: %s", op, err)
        self._down = True
        self._disconnect()
        self._retry_at = time.monotonic() + self.retry_s

    def _disconnect(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._outstanding.clear()
        self._unmap()


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
