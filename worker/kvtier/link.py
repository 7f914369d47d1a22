"""The engine's connection to its sidecar: the Unix socket and the protocol's calls, with the
replies to pipelined sends read in order before the next call's, and what the sidecar's hello
maps: its shared-memory slots (page-locked for a GPU's DMA where the driver allows) and, where
it offers direct I/O, the NVMe data file and threads for its reads and writes. A failure ends
the connection; the next call after ``retry_s`` connects afresh (pins are sent again: a
restarted sidecar forgets them).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from strata.worker.kvtier import protocol
from strata.worker.kvtier.arena import SlotArena
from strata.worker.kvtier.pagelock import page_lock, page_unlock

log = logging.getLogger(__name__)


class SidecarUnavailable(Exception):
    """The sidecar did not answer; the caller degrades to a miss."""


class SidecarLink:
    def __init__(
        self,
        socket_path: str,
        block_bytes: int,
        timeout_s: float,
        retry_s: float,
        pins: Sequence[bytes],
        direct_io: bool,
    ) -> None:
        self.socket_path, self.block_bytes = socket_path, block_bytes
        self.timeout_s, self.retry_s = timeout_s, retry_s
        self.lock = threading.RLock()
        self.sock: socket.socket | None = None
        self.arena: SlotArena | None = None
        self.slots: torch.Tensor | None = None  # uint8 view over the whole arena
        self.page_locked = False  # registered with CUDA: device copies are DMA
        self._retry_at = 0.0
        self.max_batch = 1
        self._down = False
        # Blocks only NVMe takes written by this process straight from the KV cache (host
        # blocks on whole pages, where the sidecar offers it: ``direct``), no staging copy.
        self.direct_io = direct_io
        self.direct_fd: int | None = None  # the NVMe data file, passed by the sidecar
        # Its reads and writes, as many at once as the sidecar's own (the NVMe tier's
        # ``io_threads``: the same queue depth).
        self.io: ThreadPoolExecutor | None = None
        self._io_depth = 0
        self.nvme_slot_bytes = 0
        self._pins = list(pins)  # re-sent on every connect: a restarted sidecar forgets them
        self.outstanding: deque[str] = deque()  # ops sent whose replies are still to be read
        self.stored = 0  # blocks the puts of the current save stored, by their replies

    def safe_call(self, message: protocol.Message) -> dict[str, Any] | None:
        with self.lock:
            try:
                return self.call(message)
            except Exception as err:
                self.fail(str(message.get("op")), err)
                return None

    def safe_send(self, message: protocol.Message) -> None:
        """A hint: sent without waiting; a failure shows up (and is handled) like any other."""
        with self.lock:
            try:
                self.send_later(message)
            except Exception as err:
                self.fail(str(message.get("op")), err)

    def call(self, message: protocol.Message) -> dict[str, Any]:
        sock = self.connected()
        self.drain(sock)
        protocol.send(sock, protocol.tagged(message))
        return self.reply(sock, str(message.get("op")))

    def call_pipelined(self, message: protocol.Message) -> dict[str, Any]:
        """``call`` without waiting for the replies still due first: they are read after
        the message is sent, in order, so it costs no extra round trip."""
        self.send_later(message)
        return self.reply_to(self.connected(), str(message.get("op")))

    def send_later(self, message: protocol.Message) -> None:
        """Send without waiting for the reply (a release, a save's put): it is read before the
        next call's, so the engine does not wait a round trip for what it does not need."""
        sock = self.connected()
        protocol.send(sock, protocol.tagged(message))
        self.outstanding.append(str(message.get("op")))

    def drain(self, sock: socket.socket) -> None:
        while self.outstanding:
            self.reply_to(sock, self.outstanding[0])

    def reply_to(self, sock: socket.socket, op: str) -> dict[str, Any]:
        """Read the replies to what was sent, in order, up to the first to an ``op`` (puts'
        stored counts summed into ``stored``)."""
        while self.outstanding:
            sent = self.outstanding.popleft()
            reply = self.reply(sock, sent)
            self.stored += int(reply.get("stored", 0)) if sent == "put" else 0
            if sent == op:
                return reply
        raise SidecarUnavailable(f"no {op} was waiting for its reply")

    def reply(self, sock: socket.socket, op: str) -> dict[str, Any]:
        reply = protocol.receive(sock)
        if reply is None:
            raise SidecarUnavailable("sidecar closed the connection")
        if not reply.get("ok"):
            raise SidecarUnavailable(f"sidecar refused {op}: {reply.get('error')}")
        return reply

    def connected(self) -> socket.socket:
        if self.sock is not None:
            return self.sock
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
        self.sock = sock
        if self._down:
            log.info("kvtier: sidecar reachable again")
        self._down = False
        return sock

    def _map(self, hello: dict[str, Any]) -> None:
        """Map the sidecar's slots (afresh: a restarted sidecar may have re-created the file)."""
        self._unmap()
        self.arena = SlotArena(hello["shm_path"], hello["slot_bytes"], hello["num_slots"], create=False)
        self.slots = torch.frombuffer(self.arena.mmap, dtype=torch.uint8)
        self.page_locked = page_lock(self.slots, hello["shm_path"])
        self.max_batch = max(1, int(hello.get("max_batch", 1)))

    def _take_direct_io(self, sock: socket.socket) -> None:
        """Ask for the NVMe data file (passed with the reply); without it, saves stage."""
        fds: list[int] = []
        protocol.send(sock, {"op": "direct_io"})
        reply = protocol.receive(sock, fds)
        if reply is not None and reply.get("ok") and len(fds) == 1:
            self.direct_fd, self.nvme_slot_bytes = fds.pop(), int(reply["slot_bytes"])
            self._direct_threads(int(reply["io_threads"]))
        else:
            log.info("kvtier: no direct NVMe I/O: %s", reply and reply.get("error"))
        for fd in fds:
            os.close(fd)

    def _direct_threads(self, depth: int) -> None:
        """Threads for the direct I/O, as many as the sidecar's (a restarted one may differ)."""
        if self.io is not None and self._io_depth != depth:
            self.io.shutdown(wait=False)
            self.io = None
        if self.io is None:
            self.io, self._io_depth = ThreadPoolExecutor(depth, thread_name_prefix="kvtier-direct"), depth

    def _unmap(self) -> None:
        if self.page_locked and self.slots is not None:
            page_unlock(self.slots)
        self.page_locked = False
        self.slots = None
        if self.direct_fd is not None:
            os.close(self.direct_fd)
            self.direct_fd = None
        if self.arena is not None:
            with contextlib.suppress(BufferError):  # a tensor view still alive; the mapping goes with it
                self.arena.close()
            self.arena = None

    def fail(self, op: str, err: Exception) -> None:
        if not self._down:  # once per outage, not once per call
            log.warning("kvtier: %s failed, degrading to recomputation: %s", op, err)
        self._down = True
        self.disconnect()
        self._retry_at = time.monotonic() + self.retry_s

    def disconnect(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.outstanding.clear()
        self._unmap()

    def close(self) -> None:
        with self.lock:
            if self.sock is not None:
                with contextlib.suppress(Exception):  # the last puts land before we go
                    self.drain(self.sock)
            self.disconnect()
        if self.io is not None:
            self.io.shutdown(wait=False)
