"""Probes, run for real: httpGet, tcpSocket and exec, with the kubelet's thresholds.

``observe`` is the pure part (consecutive successes and failures flip the result at the
thresholds); ``check`` runs one probe against the pod's IP, or inside the container for exec.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from strata.cluster.podruntime.spec import Container, HttpGet, Probe, TcpSocket

# What a probe reads before its first result: a container is not ready until its readiness probe
# passes, is alive until its liveness probe fails, and is not started until its startup probe passes.
INITIAL = {"startup": False, "readiness": False, "liveness": True}

ExecRunner = Callable[[tuple[str, ...], float], Awaitable[int]]


@dataclass(frozen=True)
class Tracker:
    success_threshold: int
    failure_threshold: int
    result: bool
    successes: int = 0
    failures: int = 0


def tracker(kind: str, probe: Probe) -> Tracker:
    return Tracker(probe.success_threshold, probe.failure_threshold, INITIAL[kind])


def observe(state: Tracker, ok: bool) -> Tracker:
    """Count consecutive outcomes; the result flips once a threshold is reached."""
    if ok:
        state = dataclasses.replace(state, successes=state.successes + 1, failures=0)
        return (
            dataclasses.replace(state, result=True) if state.successes >= state.success_threshold else state
        )
    state = dataclasses.replace(state, failures=state.failures + 1, successes=0)
    return dataclasses.replace(state, result=False) if state.failures >= state.failure_threshold else state


async def _http(
    action: HttpGet, host: str, port: int, timeout_s: float, session: aiohttp.ClientSession
) -> bool:
    headers = {h["name"]: h["value"] for h in action.http_headers if "name" in h}
    headers.setdefault("User-Agent", "kube-probe/strata")
    url = f"{action.scheme.lower()}://{action.host or host}:{port}{action.path}"
    async with session.get(
        url, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s), ssl=False
    ) as reply:
        return 200 <= reply.status < 400


async def _tcp(action: TcpSocket, host: str, port: int, timeout_s: float) -> bool:
    _, writer = await asyncio.wait_for(asyncio.open_connection(action.host or host, port), timeout_s)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


@dataclass(frozen=True)
class ProbeTarget:
    container: Container
    pod_ip: str
    session: aiohttp.ClientSession
    exec_in_container: ExecRunner


async def check(probe: Probe, target: ProbeTarget) -> bool:
    """One probe attempt; any error, refusal or timeout is a failure."""
    timeout_s = float(max(probe.timeout_seconds, 1))
    try:
        if probe.http_get is not None:
            port = target.container.port_number(probe.http_get.port)
            return await _http(probe.http_get, target.pod_ip, port, timeout_s, target.session)
        if probe.tcp_socket is not None:
            port = target.container.port_number(probe.tcp_socket.port)
            return await _tcp(probe.tcp_socket, target.pod_ip, port, timeout_s)
        if probe.exec is not None:
            return await target.exec_in_container(probe.exec.command, timeout_s) == 0
    except (TimeoutError, OSError, aiohttp.ClientError, ValueError):
        return False
    return True  # a probe with no handler: the API server refuses these, treat as passing
