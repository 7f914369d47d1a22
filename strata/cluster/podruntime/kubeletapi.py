"""The kubelet's HTTPS endpoint for the runtime's nodes: ``GET /containerLogs/...``, so that
``kubectl logs`` works for a local-node pod the way it does on a real node.

The API server dials it at the node's loopback InternalIP and the port the node advertises
(``daemonEndpoints.kubeletEndpoint``), proving itself with its kubelet client certificate; the
runtime serves only clients whose certificate the cluster CA signed and whose name is that
client's, as a kubelet with webhook authorization would refuse everyone else. Logs are the
files the runtime writes (``podfiles``): one per run of a container, numbered by restart.
"""

from __future__ import annotations

import asyncio
import datetime
import re
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from strata.cluster import podfiles
from strata.cluster.certs import KUBELET_CLIENT

FOLLOW_POLL_S = 0.5
LISTEN_HOST = "127.0.0.1"
OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class LogQuery:
    tail_lines: int | None = None
    limit_bytes: int | None = None
    previous: bool = False
    timestamps: bool = False
    follow: bool = False


def _flag(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


def _count(params: Mapping[str, str], name: str) -> int | None:
    if name not in params:
        return None
    try:
        value = int(params[name])
    except ValueError:
        raise ValueError(f"{name}: not an integer: {params[name]!r}") from None
    if value < 0 or (name == "limitBytes" and value == 0):
        raise ValueError(f"{name}: must be positive, got {value}")
    return value


def parse_log_query(params: Mapping[str, str]) -> LogQuery:
    """The kubelet's log options from a query string; ValueError naming a bad one."""
    return LogQuery(
        tail_lines=_count(params, "tailLines"),
        limit_bytes=_count(params, "limitBytes"),
        previous=_flag(params.get("previous")),
        timestamps=_flag(params.get("timestamps")),
        follow=_flag(params.get("follow")),
    )


def check_names(*names: str) -> None:
    """ValueError unless each is an object name (they become file name patterns here)."""
    for name in names:
        if not OBJECT_NAME.fullmatch(name):
            raise ValueError(f"not an object name: {name!r}")


def rfc3339(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


def shape_log(data: bytes, query: LogQuery, written_at: float) -> bytes:
    """The kubelet's order: the last ``tailLines`` lines, each stamped when asked, then cut to
    ``limitBytes``. The runtime records output, not when each line came, so a stamp is the time
    of the log file's last write."""
    lines = data.splitlines(keepends=True)
    if query.tail_lines is not None:
        lines = lines[len(lines) - query.tail_lines :] if query.tail_lines else []
    if query.timestamps:
        stamp = rfc3339(written_at).encode() + b" "
        lines = [stamp + line for line in lines]
    out = b"".join(lines)
    return out[: query.limit_bytes] if query.limit_bytes is not None else out


def authorized(peer: Mapping[str, Any] | None) -> bool:
    """Whether a verified peer certificate (``ssl`` getpeercert form) is the API server's
    kubelet client."""
    subject = (peer or {}).get("subject") or ()
    names = [value for rdn in subject for key, value in rdn if key == "commonName"]
    return names == [KUBELET_CLIENT]


def server_context(cert: Path, key: Path, client_ca: Path) -> ssl.SSLContext:
    """TLS that requires a client certificate signed by ``client_ca`` (the handshake fails
    without one)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(client_ca))
    context.load_cert_chain(str(cert), str(key))
    context.verify_mode = ssl.CERT_REQUIRED
    return context


@dataclass(frozen=True)
class LogFiles:
    """Where the runtime keeps logs and container records (the runtime's ``--logs`` and
    ``<root>/pods``)."""

    logs: Path
    state: Path

    def run(self, namespace: str, pod: str, container: str, previous: bool) -> Path | None:
        directory = podfiles.pod_dir(self.logs, namespace, pod)
        if directory is None:
            return None
        runs = podfiles.container_runs(directory / container)
        wanted = runs[-2:-1] if previous else runs[-1:]
        return wanted[0] if wanted else None

    def still_written(self, namespace: str, pod: str, container: str, path: Path) -> bool:
        """Whether ``path`` is the container's current run and its process is alive."""
        current = self.run(namespace, pod, container, previous=False)
        alive = podfiles.container_pid(self.state, namespace, pod, container) is not None
        return current == path and alive


@web.middleware
async def _only_the_apiserver(request: web.Request, handler: Handler) -> web.StreamResponse:
    if not authorized(request.transport.get_extra_info("peercert") if request.transport else None):
        raise web.HTTPForbidden(text=f"only {KUBELET_CLIENT} may read this node's logs\n")
    return await handler(request)


def _not_found(query: LogQuery, namespace: str, pod: str, container: str) -> web.HTTPException:
    which = "previous terminated container" if query.previous else "container"
    text = f'{which} "{container}" in pod "{pod}" (namespace {namespace}) has no log on this node\n'
    return web.HTTPBadRequest(text=text) if query.previous else web.HTTPNotFound(text=text)


def app(files: LogFiles) -> web.Application:
    async def container_logs(request: web.Request) -> web.StreamResponse:
        namespace, pod, container = (request.match_info[k] for k in ("namespace", "pod", "container"))
        try:
            check_names(namespace, pod, container)
            query = parse_log_query(request.query)
        except ValueError as error:
            raise web.HTTPBadRequest(text=f"{error}\n") from None
        path = files.run(namespace, pod, container, query.previous)
        if path is None:
            raise _not_found(query, namespace, pod, container)
        if not query.follow:
            return web.Response(body=_read(path, query), content_type="text/plain")
        return await _follow(request, files, (namespace, pod, container), path, query)

    application = web.Application(middlewares=[_only_the_apiserver])
    application.router.add_get("/containerLogs/{namespace}/{pod}/{container}", container_logs)
    return application


def _read(path: Path, query: LogQuery) -> bytes:
    return shape_log(path.read_bytes(), query, path.stat().st_mtime)


async def _follow(
    request: web.Request, files: LogFiles, ref: tuple[str, str, str], path: Path, query: LogQuery
) -> web.StreamResponse:
    """What is there, then each whole line the run goes on writing (stamped as it is read), until
    the run ends, ``limitBytes`` is sent or the client leaves."""
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await response.prepare(request)
    data, written_at = _snapshot(path)
    offset = _whole_lines(data)
    first = shape_log(data[:offset], query, written_at)
    await response.write(first)
    sent = len(first)
    later = LogQuery(limit_bytes=query.limit_bytes, timestamps=query.timestamps)
    running = True
    while running and (query.limit_bytes is None or sent < query.limit_bytes):
        await asyncio.sleep(FOLLOW_POLL_S)
        running = files.still_written(*ref, path)
        data = _read_from(path, offset)
        end = len(data) if not running else _whole_lines(data)  # a last partial line at the end
        offset += end
        chunk = shape_log(data[:end], later, time.time())[: _left(query, sent)]
        sent += len(chunk)
        await response.write(chunk)
    return response


def _snapshot(path: Path) -> tuple[bytes, float]:
    return path.read_bytes(), path.stat().st_mtime


def _whole_lines(data: bytes) -> int:
    """The length of ``data``'s whole lines (what follows its last newline is still being written)."""
    return data.rfind(b"\n") + 1


def _left(query: LogQuery, sent: int) -> int | None:
    return None if query.limit_bytes is None else query.limit_bytes - sent


def _read_from(path: Path, offset: int) -> bytes:
    with path.open("rb") as log:
        log.seek(offset)
        return log.read()


async def serve(files: LogFiles, context: ssl.SSLContext) -> tuple[web.AppRunner, int]:
    """Start serving on a free loopback port; (the runner to clean up, the port)."""
    runner = web.AppRunner(app(files), access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind((LISTEN_HOST, 0))
    await web.SockSite(runner, sock, ssl_context=context).start()
    return runner, int(sock.getsockname()[1])
