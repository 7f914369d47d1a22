"""The sidecar process: the block service behind the Unix-socket protocol, the metrics
endpoint, and a retention sweeper. Thin glue; decisions live in ``service``."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import socketserver
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any

from strata.common.logs import REQUEST_ID
from strata.worker.block_events import BlockEvents
from strata.worker.config import KVTierConfig
from strata.worker.kvtier import protocol, walls
from strata.worker.kvtier.announced import ANNOUNCED_TTL_S, Announcers
from strata.worker.kvtier.metrics import TierMetrics, serve_http
from strata.worker.kvtier.protocol import Message
from strata.worker.kvtier.service import KVTierService, Owner, PutBlock

log = logging.getLogger(__name__)


# Requests a connection handles before the puts it read earlier are committed (the two steps
# of a save's pipeline); any other request first waits for them, so it sees their blocks.
PIPELINED = frozenset({"reserve", "put"})
# The requests of a load: any other one gives back an answer read ahead for the load.
LOADING = frozenset({"get", "release"})
SETTLE_S = 120.0  # the longest a request waits for the commits of the puts before it


def handle(service: KVTierService, owner: Owner, request: Message) -> Message:
    """One request to one reply (a put's once its blocks are committed)."""
    return start(service, owner, request).result()


def start(service: KVTierService, owner: Owner, request: Message) -> Future[Message]:
    """One request to its reply, ready at once except a put's: that is ready once the put's
    staging blocks are committed (see ``KVTierService.put_async``). Lines logged meanwhile
    carry the engine's request id."""
    request_id = request.get(protocol.REQUEST_ID_FIELD)
    token = REQUEST_ID.set(request_id if isinstance(request_id, str) else None)
    try:
        if request.get("op") == "put":
            return _put_async(service, owner, request)
        return _ready(_dispatch(service, owner, request))
    finally:
        REQUEST_ID.reset(token)


def _put_async(service: KVTierService, owner: Owner, request: Message) -> Future[Message]:
    try:
        pending = service.put_async(owner, _put_blocks(request), _written(request))
    except (ValueError, KeyError, TypeError, RuntimeError) as err:
        return _ready({"ok": False, "error": str(err)})
    reply: Future[Message] = Future()
    pending.add_done_callback(lambda done: reply.set_result(_stored(done)))
    return reply


def _stored(done: Future[int]) -> Message:
    error = done.exception()
    if error is not None:  # a fault of the sidecar's, not of the request: still answered
        log.error("kvtier: put failed: %s", error)
        return {"ok": False, "error": f"put: {error}"}
    return {"ok": True, "stored": done.result()}


def _ready(message: Message) -> Future[Message]:
    future: Future[Message] = Future()
    future.set_result(message)
    return future


def _dispatch(service: KVTierService, owner: Owner, request: Message) -> Message:
    """Bad input becomes an error reply naming the field."""
    op = request.get("op")
    handler = _HANDLERS.get(op) if isinstance(op, str) else None
    if handler is None:
        return {"ok": False, "error": f"op: unknown operation {op!r}; expected one of {sorted(_HANDLERS)}"}
    try:
        return {"ok": True, **handler(service, owner, request)}
    except (ValueError, KeyError, TypeError, RuntimeError) as err:
        return {"ok": False, "error": str(err)}


def _hello(service: KVTierService, owner: Owner, request: Message) -> dict[str, Any]:
    block_bytes = request.get("block_bytes")
    if not isinstance(block_bytes, int) or block_bytes <= 0:
        raise ValueError("block_bytes: expected a positive integer")
    return service.configure(block_bytes)


def _lookup(service: KVTierService, owner: Owner, request: Message) -> dict[str, Any]:
    return {"tiers": service.lookup(protocol.keys_from(request))}


def _get(service: KVTierService, owner: Owner, request: Message) -> dict[str, Any]:
    keys = protocol.keys_from(request)
    found = service.get_direct(owner, keys) if _flag(request, "direct") else None
    on_nvme = found is not None  # NVMe slots, for the engine to read itself
    found = found if found is not None else service.get(owner, keys)
    answer = {"slots": [s for s, _ in found], "checksums": [c for _, c in found]}
    return answer | {"nvme": True} if on_nvme else answer


def _release(service: KVTierService, owner: Owner, request: Message) -> dict[str, Any]:
    nvme = _ints(request, "nvme_slots") if "nvme_slots" in request else []
    service.release(owner, _ints(request, "slots"), nvme)
    return {}


def _flag(request: Message, field: str) -> bool:
    value = request.get(field, False)
    if not isinstance(value, bool):
        raise ValueError(f"{field}: expected true or false")
    return value


def _reserve(service: KVTierService, owner: Owner, request: Message) -> dict[str, Any]:
    keys = protocol.keys_from(request)
    parents = protocol.keys_from(request, "parents") if "parents" in request else None
    direct = _flag(request, "direct")
    slots, nvme = service.reserve_direct(owner, keys, parents, direct)
    # Staging slots are written down at once: their checksums, taken along the engine's copy
    # (while the bytes are in its cache), spare the write path a pass over each slot.
    reply = {"slots": slots, "hash": [slot is not None and service.is_staging(slot) for slot in slots]}
    return reply | {"nvme": nvme} if direct else reply


def _direct_io(service: KVTierService, owner: Owner, request: Message) -> dict[str, Any]:
    fd, slot_bytes = service.direct_io(owner)
    io_threads = service.config.nvme.io_threads  # the engine's queue depth: the sidecar's own
    return {"slot_bytes": slot_bytes, "io_threads": io_threads, protocol.FDS_FIELD: [fd]}


def _put(service: KVTierService, owner: Owner, request: Message) -> dict[str, Any]:
    return {"stored": service.put(owner, _put_blocks(request), _written(request))}


def _written(request: Message) -> list[tuple[int, int]]:
    """The NVMe slots the engine wrote itself, with their checksums (both required)."""
    if "nvme_slots" not in request and "nvme_checksums" not in request:
        return []
    slots, sums = _ints(request, "nvme_slots"), _ints(request, "nvme_checksums")
    if len(slots) != len(sums):
        raise ValueError("nvme_slots, nvme_checksums: must have the same length")
    return list(zip(slots, sums, strict=True))


def _put_blocks(request: Message) -> list[PutBlock]:
    keys = protocol.keys_from(request)
    parents = protocol.keys_from(request, "parents")
    slots = _ints(request, "slots")
    sums = _checksums(request) if "checksums" in request else [None] * len(keys)
    if not len(keys) == len(parents) == len(slots) == len(sums):
        raise ValueError("keys, parents, slots, checksums: must have the same length")
    return [PutBlock(*fields) for fields in zip(keys, parents, slots, sums, strict=True)]


def _prefetch(service: KVTierService, owner: Owner, request: Message) -> dict[str, Any]:
    service.prefetch(protocol.keys_from(request))
    return {}


def _expect(service: KVTierService, owner: Owner, request: Message) -> dict[str, Any]:
    service.expect(owner, _name(request, "request"), protocol.keys_from(request))
    return {}


def _unexpect(service: KVTierService, owner: Owner, request: Message) -> dict[str, Any]:
    names = request.get("requests")
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError("requests: expected a list of request ids (strings)")
    service.unexpect(owner, names)
    return {}


def _name(request: Message, field: str) -> str:
    value = request.get(field)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{field}: expected a non-empty string")
    return value


def _pin(service: KVTierService, owner: Owner, request: Message) -> dict[str, Any]:
    service.pin(protocol.keys_from(request))
    return {}


def _corrupt(service: KVTierService, owner: Owner, request: Message) -> dict[str, Any]:
    service.report_corrupt(protocol.keys_from(request))
    return {}


def _stats(service: KVTierService, owner: Owner, request: Message) -> dict[str, Any]:
    return service.stats()


def _checksums(request: Message) -> list[int | None]:
    raw = request.get("checksums")
    if not isinstance(raw, list) or not all(v is None or isinstance(v, int) for v in raw):
        raise ValueError("checksums: expected a list of integers (or null where the sidecar takes it)")
    return raw


def _ints(request: Message, field: str) -> list[int]:
    raw = request.get(field)
    if not isinstance(raw, list) or not all(isinstance(v, int) for v in raw):
        raise ValueError(f"{field}: expected a list of integers")
    return raw


_HANDLERS: dict[str, Callable[[KVTierService, Owner, Message], dict[str, Any]]] = {
    "hello": _hello,
    "lookup": _lookup,
    "get": _get,
    "release": _release,
    "reserve": _reserve,
    "direct_io": _direct_io,
    "put": _put,
    "prefetch": _prefetch,
    "expect": _expect,
    "unexpect": _unexpect,
    "pin": _pin,
    "corrupt": _corrupt,
    "stats": _stats,
}


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    service: KVTierService

    def __init__(self, path: str) -> None:
        super().__init__(path, _Connection)
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()

    def verify_request(self, request: Any, client_address: Any) -> bool:
        """Only the sidecar's own user (the engine of its pod) may connect (``walls``)."""
        uid = walls.peer_uid(request)
        if walls.peer_allowed(uid, walls.own_uid()):
            return True
        log.warning(
            "kvtier: refused a connection from uid %d (only uid %d may connect)", uid, walls.own_uid()
        )
        return False

    def close_connections(self) -> None:
        with self.connections_lock:
            for sock in self.connections:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class _Connection(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server: _Server = self.server  # type: ignore[assignment]
        service = server.service
        sock: socket.socket = self.request
        owner = Owner()
        with server.connections_lock:
            server.connections.add(sock)
        replies = _Replies(sock)
        try:
            while (request := protocol.receive(sock)) is not None:
                op = request.get("op")
                if op not in PIPELINED:
                    replies.settle()
                if op not in LOADING:
                    service.drop_ahead(owner)
                replies.push(start(service, owner, request))
                if op == "get":  # answered: read what the client asks for next meanwhile
                    service.read_ahead(owner)
        except (protocol.ProtocolError, OSError) as err:
            log.debug("kvtier: connection ended: %s", err)
        finally:
            replies.close()
            with server.connections_lock:
                server.connections.discard(sock)
            service.drop_owner(owner)


class _Replies:
    """A connection's replies, in request order. A reply that is ready with nothing ahead of
    it is sent at once by the reading thread; one that waits (a put's, for its commit), and
    every reply behind it, is sent by a thread of the connection's own, so that the connection
    reads on (a save's next reserve and put) meanwhile. A failed send shuts the socket, which
    ends the reading side too."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Condition()
        self._waiting: deque[Future[Message]] = deque()  # not sent yet, oldest first
        self._closed = self._broken = False
        self._thread = threading.Thread(target=self._send_waiting, name="kvtier-replies", daemon=True)
        self._thread.start()

    def push(self, reply: Future[Message]) -> None:
        with self._lock:
            if not self._waiting and reply.done():
                self._send(reply.result())
                return
            self._waiting.append(reply)
            self._lock.notify()

    def settle(self) -> None:
        """Until every reply pushed so far is ready (the puts before have taken effect)."""
        with self._lock:
            pending = list(self._waiting)
        wait(pending, timeout=SETTLE_S)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()
        self._thread.join(timeout=SETTLE_S)

    def _send_waiting(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._waiting or self._closed)
                if not self._waiting:
                    return
                head = self._waiting[0]
            message = head.result()  # resolved by the committer, errors included
            with self._lock:
                self._send(message)
                self._waiting.popleft()

    def _send(self, message: Message) -> None:
        """Under the lock: one writer at a time, in order."""
        if self._broken:
            return
        try:
            protocol.send(self._sock, message)
        except (protocol.ProtocolError, OSError) as err:
            log.debug("kvtier: reply not sent: %s", err)
            self._broken = True
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)


class Sidecar:
    """Everything ``strata kvtier serve`` runs; ``start`` returns once it accepts connections."""

    def __init__(
        self,
        config: KVTierConfig,
        block_bytes: int | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "0.0.0.0",
        engine_events: BlockEvents | None = None,
        tenant: str = "",
    ):
        self.config = config
        self.engine_events = engine_events  # a vLLM engine's HBM blocks, relayed
        self.metrics = TierMetrics()
        self.service = KVTierService(config, self.metrics, tenant=tenant)
        self.announcers = Announcers(self.service)
        if block_bytes:
            self.service.configure(block_bytes)
        self._metrics_port = config.metrics_port if metrics_port is None else metrics_port
        self._metrics_host = metrics_host
        self._stop = threading.Event()
        self._server: _Server | None = None
        self._http: Any = None

    def start(self) -> None:
        path = Path(self.config.socket_path)
        walls.socket_dir(path.parent)
        path.unlink(missing_ok=True)  # a previous run's socket; the previous run is gone
        self._server = _Server(str(path))
        self._server.service = self.service
        os.chmod(path, walls.PRIVATE_FILE)
        threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="kvtier-socket", daemon=True
        ).start()
        if self._metrics_port:
            self._http = serve_http(
                self._metrics_port,
                self.metrics,
                self._serving,
                self._metrics_host,
                events=self.service.events,
                announce=self.announcers.handle,
                engine_events=self.engine_events,
            )
        threading.Thread(target=self._sweep_loop, name="kvtier-sweep", daemon=True).start()
        threading.Thread(target=self._expire_loop, name="kvtier-announced", daemon=True).start()
        log.info("kvtier: serving on %s, metrics on %s:%s", path, self._metrics_host, self._metrics_port)

    def _serving(self) -> bool:
        return self._server is not None

    def _expire_loop(self) -> None:
        """Forgets what routers that stopped announcing had announced."""
        while not self._stop.wait(ANNOUNCED_TTL_S / 3):
            self.announcers.expire()

    def _sweep_loop(self) -> None:
        retention = self.config.retention_s
        if retention is None:
            return
        while not self._stop.wait(min(retention / 4, 10.0)):
            if dropped := self.service.sweep():
                log.info("kvtier: retention dropped %d blocks", dropped)

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> threading.Event:
        """Set once the sidecar is asked to stop: what its helper threads wait on."""
        return self._stop

    @property
    def connections(self) -> int:
        """Open protocol connections: each is an engine (or a tool) still using the tiers."""
        server = self._server
        if server is None:
            return 0
        with server.connections_lock:
            return len(server.connections)

    def wait_disconnected(self, timeout_s: float, cut: Callable[[], bool]) -> bool:
        """Block until no connection is open (True), the timeout passes or ``cut()`` (False)."""
        deadline = time.monotonic() + timeout_s
        while self.connections:
            if cut() or time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def wait(self) -> None:
        self._stop.wait()

    def stop(self) -> None:
        self._stop.set()
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server.close_connections()
        self._server = None
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
        self.service.close()
        Path(self.config.socket_path).unlink(missing_ok=True)
