"""A userspace Service proxy for the pods this runtime runs (the part of kube-proxy a test
cluster on one machine needs): it listens on each Service's ClusterIP and TCP ports and forwards
every connection to one of the Service's Ready local pods, round robin (endpoints.py decides).

It watches Services only: the pods are the runtime's own, read at each connection from its node
agents, so a pod counts as soon as the runtime reported it Ready and stops counting as soon as it
is terminating. No Ready pod: the connection is closed at once. Every address is loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from pydantic import ValidationError

from strata.cluster.podruntime import endpoints
from strata.cluster.podruntime.endpoints import Listener, PodEndpoint
from strata.cluster.podruntime.services import Service, parse_service
from strata.operator.kube import KubeClient
from strata.operator.kubewatch import watch

log = logging.getLogger(__name__)
CONNECT_TIMEOUT_S = 5.0
CHUNK = 64 * 1024

PodSource = Callable[[], Iterable[PodEndpoint]]


class ServiceProxy:
    def __init__(self, api: KubeClient, service_cidr: str, pods: PodSource) -> None:
        self.api, self.service_cidr, self.pods = api, service_cidr, pods
        self.services: dict[tuple[str, str], Service] = {}
        self.servers: dict[Listener, asyncio.Server] = {}
        self.turns: dict[Listener, int] = {}
        self.connections: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
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
            self.servers[listener] = await asyncio.start_server(accept, listener.ip, listener.port)
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
            upstream = await self._connect(listener)
            if upstream is not None:
                await _pipe(reader, writer, *upstream)
        finally:
            self.connections.discard(task)
            writer.close()

    async def _connect(self, listener: Listener) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """A connection to the next Ready pod (the others tried in turn if it refuses); None when
        no pod takes it."""
        service = self.services.get((listener.namespace, listener.service))
        if service is None:
            return None
        turn = self.turns.get(listener, 0)
        self.turns[listener] = turn + 1
        usable, refused = endpoints.split_loopback(endpoints.endpoints(service, listener.port, self.pods()))
        for ip, port in refused:
            log.error("refusing to forward to %s:%d: not a loopback address", ip, port)
        for ip, port in endpoints.pick(usable, turn):
            with contextlib.suppress(OSError, TimeoutError):
                return await asyncio.wait_for(asyncio.open_connection(ip, port), CONNECT_TIMEOUT_S)
        log.info(
            "service %s/%s:%d: no Ready pod took the connection",
            listener.namespace,
            listener.service,
            listener.port,
        )
        return None


async def _pipe(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
) -> None:
    """Copy both ways until either side is done; then close both."""
    try:
        await asyncio.gather(_copy(reader, up_writer), _copy(up_reader, writer))
    finally:
        up_writer.close()


async def _copy(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, ConnectionError):
        while data := await source.read(CHUNK):
            sink.write(data)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
