"""Which workers exist: the service's worker Pods, watched through their label selector.

As the Gateway API Inference Extension's endpoint picker does, and not through EndpointSlices
(which refuse the loopback pod IPs of the test control plane): a Pod is an endpoint once it has
an IP; it takes requests while its Ready condition is True and it has no deletion timestamp.
A terminating Pod takes nothing new but keeps its streams (the router never cuts them).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from strata.common.endpoints import ENGINE_EVENTS_PATH, EVENTS_PATH, EXPECT_PATH
from strata.router.config import WorkersConfig
from strata.router.fleet import Address
from strata.router.kube import KubeError, PodReader

log = logging.getLogger(__name__)
RETRY_S = 2.0


@dataclass(frozen=True)
class PodState:
    name: str
    address: Address
    ready: bool
    terminating: bool


def address(host: str, workers: WorkersConfig) -> Address:
    """A worker's API and its block-event streams: the engine's HBM (a vLLM engine's through its
    sidecar's relay; none without a sidecar) and the sidecar's lower tiers."""
    host = f"[{host}]" if ":" in host else host
    url = f"http://{host}:{workers.port}"
    events = {"worker": url + EVENTS_PATH} if workers.engine == "torch" else {}
    if workers.kv_events_port is None:
        return Address(url, events)
    sidecar = f"http://{host}:{workers.kv_events_port}"
    events["sidecar"] = sidecar + EVENTS_PATH
    if workers.engine == "vllm":
        events["worker"] = sidecar + ENGINE_EVENTS_PATH
    return Address(url, events, sidecar + EXPECT_PATH)


def pod_state(pod: Mapping[str, Any], workers: WorkersConfig) -> PodState | None:
    """The endpoint a Pod is, or None while it has no IP."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    ip = status.get("podIP")
    if not ip or not meta.get("name"):
        return None
    conditions = status.get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return PodState(meta["name"], address(ip, workers), ready, meta.get("deletionTimestamp") is not None)


def static_states(workers: WorkersConfig) -> list[PodState]:
    """Fixed URLs (local runs): always ready; failures still mark them down for a while."""
    out = []
    for url in workers.static:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or workers.port
        base = address(host, workers.model_copy(update={"port": port}))
        out.append(PodState(url, base, True, False))
    return out


Apply = Callable[[dict[str, PodState]], None]


async def watch_pods(reader: PodReader, workers: WorkersConfig, apply: Apply) -> None:
    """Keep ``apply``-ing the current set of worker Pods, forever: list, then watch from the
    list's version; on any error or a watch the server ended, list again."""
    while True:
        try:
            pods, version = await reader.list()
            current = {s.name: s for p in pods if (s := pod_state(p, workers))}
            apply(dict(current))
            async for event in reader.watch(version):
                if _changed(event, workers, current):
                    apply(dict(current))
        except (TimeoutError, KubeError, OSError, ValueError) as exc:
            log.warning("pod watch failed, listing again in %.0fs: %s", RETRY_S, exc)
            await asyncio.sleep(RETRY_S)


def _changed(event: Mapping[str, Any], workers: WorkersConfig, current: dict[str, PodState]) -> bool:
    kind, pod = event.get("type"), event.get("object") or {}
    if kind == "ERROR":
        raise KubeError(int(pod.get("code", 0) or 0), str(pod.get("message", "watch error")))
    name = (pod.get("metadata") or {}).get("name")
    if kind not in ("ADDED", "MODIFIED", "DELETED") or not name:
        return False  # bookmarks
    state = None if kind == "DELETED" else pod_state(pod, workers)
    before = current.pop(name, None)
    if state is not None:
        current[name] = state
    return state != before
