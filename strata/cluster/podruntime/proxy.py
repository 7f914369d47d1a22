"""A userspace Service proxy for the pods this runtime runs (the part of kube-proxy a test
cluster on one machine needs): it listens on each Service's ClusterIP and TCP ports and forwards
every connection to one of the Service's Ready local pods, round robin (endpoints.py decides).

It watches Services only: the pods are the runtime's own, read at each connection from its node
agents, so a pod counts as soon as the runtime reported it Ready and stops counting as soon as it
is terminating. Every address is loopback.

A pod that closes a connection before answering a single byte (a router killed with the
request in hand) has it sent to another pod: the proxy keeps what the client sent until a pod
answers (``Exchange``; up to ``REPLAY_LIMIT``), as the routers keep a request until a worker
answers. Once a byte came back, nothing is sent again: a reply cut short is the client's to see.

A burst must not lose connections the proxy already accepted: it listens with a deep accept
queue, raises its own open-file limit to the hard limit (each connection is two descriptors),
and a connection whose pod does not take it at once (SYNs dropped while a busy pod's own accept
queue is full, a pod restarting, none Ready for a moment) is tried again on every Ready pod, with
a growing pause, until ``connect_deadline_s``; only then is it closed unanswered. A client that
got a connection would otherwise see it closed with no answer while the pods were merely busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from pydantic import ValidationError

from strata.cluster.podruntime import endpoints
from strata.cluster.podruntime.endpoints import Listener, PodEndpoint
from strata.cluster.podruntime.services import Service, parse_service
from strata.operator.kube import KubeClient
from strata.operator.kubewatch import watch

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 5.0  # one attempt: a dropped SYN is sent again after 1 s, then 3 s
CONNECT_DEADLINE_S = 60.0  # every attempt for one connection: a router restarts within it
LISTEN_BACKLOG = 4096  # the kernel caps it at net.core.somaxconn
CHUNK = 64 * 1024

PodSource = Callable[[], Iterable[PodEndpoint]]


class ServiceProxy:
    def __init__(
        self,
        api: KubeClient,
        service_cidr: str,
        pods: PodSource,
        connect_deadline_s: float = CONNECT_DEADLINE_S,
    ) -> None:
        self.api, self.service_cidr, self.pods = api, service_cidr, pods
        self.connect_deadline_s = connect_deadline_s
        self.services: dict[tuple[str, str], Service] = {}
        self.servers: dict[Listener, asyncio.Server] = {}
        self.turns: dict[Listener, int] = {}
        self.connections: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        raise_open_files_limit()
        try:
            async for event in watch(self.api, "/api/v1/services", {}):
                try:
                    service = parse_service(event.object)
                except ValidationError as error:  # never seen from an apiserver; one bad object stops nothing
                    log.warning("service not understood, not proxied: %s", error)
                    continue
                if event.type == "DELETED":
                    self.services.pop(service.key, None)
                else:
                    self.services[service.key] = service
                await self._sync(service.key)
        finally:
            await self.close()

    async def close(self) -> None:
        for server in self.servers.values():
            server.close()
        for task in self.connections:
            task.cancel()
        await asyncio.gather(*self.connections, return_exceptions=True)
        self.servers.clear()

    async def _sync(self, key: tuple[str, str]) -> None:
        """Open the listeners the Service wants now and close those it no longer does."""
        service = self.services.get(key)
        wanted: list[Listener] = []
        if service is not None:
            wanted, refused = endpoints.listeners(service, self.service_cidr)
            if refused:
                log.warning("service %s/%s not proxied: %s", *key, refused)
        stale = [x for x in self.servers if (x.namespace, x.service) == key and x not in wanted]
        for listener in stale:
            self.servers.pop(listener).close()
        for listener in wanted:
            if listener not in self.servers:
                await self._listen(listener)

    async def _listen(self, listener: Listener) -> None:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._forward(listener, reader, writer)

        try:
            server = await asyncio.start_server(accept, listener.ip, listener.port, backlog=LISTEN_BACKLOG)
            self.servers[listener] = server
        except OSError as error:  # another cluster on this machine holds the same ClusterIP:port
            log.warning(
                "service %s/%s: cannot listen on %s:%d: %s",
                listener.namespace,
                listener.service,
                listener.ip,
                listener.port,
                error,
            )

    async def _forward(
        self, listener: Listener, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.connections.add(task)
        try:
            exchange = Exchange()
            for _ in range(MAX_SENDS):
                upstream = await self._connect(listener)
                if upstream is None:
                    return
                await _relay(reader, writer, *upstream, exchange)
                if not exchange.resendable or writer.is_closing():
                    return
                log.info(
                    "service %s/%s: a pod closed a connection unanswered; another takes it", *_key(listener)
                )
        finally:
            self.connections.discard(task)
            writer.close()

    async def _connect(self, listener: Listener) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A connection to the next Ready pod, the others tried in turn, every round again after
        a pause until ``connect_deadline_s``; None when no pod took it by then."""
        turn = self.turns.get(listener, 0)
        self.turns[listener] = turn + 1
        deadline = time.monotonic() + self.connect_deadline_s
        for attempt in range(MAX_ROUNDS):
            upstream = await self._connect_once(listener, turn + attempt)
            if upstream is not None:
                return upstream
            pause = retry_pause_s(attempt)
            if time.monotonic() + pause > deadline:
                break
            await asyncio.sleep(pause)
        log.warning(
            "service %s/%s:%d: no Ready pod took the connection within %.0f s",
            listener.namespace,
            listener.service,
            listener.port,
            self.connect_deadline_s,
        )
        return None

    async def _connect_once(
        self, listener: Listener, turn: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """One round over the Service's Ready pods, starting at ``turn``'s."""
        service = self.services.get((listener.namespace, listener.service))
        if service is None:
            return None
        usable, refused = endpoints.split_loopback(endpoints.endpoints(service, listener.port, self.pods()))
        for ip, port in refused:
            log.error("refusing to forward to %s:%d: not a loopback address", ip, port)
        for ip, port in endpoints.pick(usable, turn):
            with contextlib.suppress(OSError, TimeoutError):
                return await asyncio.wait_for(asyncio.open_connection(ip, port), CONNECT_TIMEOUT_S)
        return None


MAX_ROUNDS = 1000  # a bound on the loop; the deadline ends it first


def retry_pause_s(attempt: int) -> float:
    """The pause after round ``attempt`` (from 0) found no pod that took the connection:
    50 ms, doubling, at most 1 s."""
    return float(min(1.0, 0.05 * 2 ** min(attempt, 10)))


def raise_open_files_limit() -> None:
    """Every proxied connection holds two descriptors: a burst of a thousand needs more than
    the usual soft limit of 1,024; the hard limit is the process's to take."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard)
            )


REPLAY_LIMIT = 1 << 20  # bytes of a request kept for another pod; a larger one is not sent again
MAX_SENDS = 3  # pods one connection is sent to, at most


@dataclass
class Exchange:
    """One client connection as far as sending it to another pod needs: what the client sent
    until a pod answered (pure bookkeeping)."""

    sent: bytearray = field(default_factory=bytearray)
    client_done: bool = False  # the client half-closed after sending
    client_gone: bool = False  # reading the client failed
    answered: bool = False  # a pod sent a byte back: nothing is sent again after that
    overflow: bool = False  # more than REPLAY_LIMIT before an answer

    @property
    def resendable(self) -> bool:
        """Whether another pod may take the connection after this one closed it: only before
        any answer, with everything the client sent still held."""
        return not (self.answered or self.overflow or self.client_gone)

    def from_client(self, data: bytes) -> None:
        if self.answered or self.overflow:
            return
        if len(self.sent) + len(data) > REPLAY_LIMIT:
            self.overflow = True
            self.sent.clear()
        else:
            self.sent += data

    def from_pod(self) -> None:
        self.answered = True
        self.sent.clear()


def _key(listener: Listener) -> tuple[str, str]:
    return listener.namespace, listener.service


async def _relay(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
    exchange: Exchange,
) -> None:
    """One pod's part of a connection: what the client sent so far first, then both ways until
    the pod is done; the client's side waits for the client only once the pod answered."""
    upward = asyncio.create_task(_upward(reader, up_writer, exchange))
    try:
        await _downward(up_reader, writer, exchange)
        if exchange.answered:
            await upward
    finally:
        # Unanswered: the next pod reads on from the client (a cancelled read leaves the bytes unread).
        upward.cancel()
        await asyncio.gather(upward, return_exceptions=True)
        up_writer.close()


async def _upward(reader: asyncio.StreamReader, up_writer: asyncio.StreamWriter, exchange: Exchange) -> None:
    """Client to pod: what an earlier pod did not answer, then what the client sends."""
    with contextlib.suppress(OSError, ConnectionError):
        up_writer.write(bytes(exchange.sent))
        if exchange.client_done:
            up_writer.write_eof()
            return
        while data := await _read_client(reader, exchange):
            exchange.from_client(data)
            up_writer.write(data)
            await up_writer.drain()
        if not exchange.client_gone:
            exchange.client_done = True
            if up_writer.can_write_eof():
                up_writer.write_eof()


async def _read_client(reader: asyncio.StreamReader, exchange: Exchange) -> bytes:
    try:
        return await reader.read(CHUNK)
    except (OSError, ConnectionError):
        exchange.client_gone = True
        return b""


async def _downward(
    up_reader: asyncio.StreamReader, writer: asyncio.StreamWriter, exchange: Exchange
) -> None:
    """Pod to client; the client's EOF only once the pod answered (else another pod will)."""
    with contextlib.suppress(OSError, ConnectionError):
        while data := await up_reader.read(CHUNK):
            exchange.from_pod()
            writer.write(data)
            await writer.drain()
        if exchange.answered and writer.can_write_eof():
            writer.write_eof()
