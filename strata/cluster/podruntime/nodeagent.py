"""The runtime playing one node's kubelet: Ready status, Lease renewals, and a worker per pod the
scheduler binds to the node."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from typing import Any

from strata.cluster.nodes import NODE_UNAVAILABLE, node_addresses
from strata.cluster.podruntime import network
from strata.cluster.podruntime.host import HOST_IP, Host, Node
from strata.cluster.podruntime.status import timestamp
from strata.cluster.podruntime.worker import PodWorker
from strata.operator.kube import STRATEGIC_MERGE_PATCH, KubeError
from strata.operator.kubewatch import Event, watch

log = logging.getLogger(__name__)

LEASE_DURATION_S = 40
LEASE_RENEW_S = 10.0
STATUS_REPORT_S = 60.0
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
RUNTIME_VERSION = "strata-pod-runtime://0.1"


def micro_time(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_status(name: str, now: float, problem: str | None, kubelet_port: int) -> dict[str, Any]:
    """The node conditions, addresses and info a kubelet posts (Ready unless ``problem``); the
    API server reaches its log endpoint at the loopback InternalIP and ``kubelet_port``."""
    stamp = timestamp(now)

    def condition(type_: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {
            "type": type_,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": stamp,
        }

    ready = condition("Ready", "True", "KubeletReady", "strata pod runtime is posting ready status")
    if problem:
        ready = condition("Ready", "False", NODE_UNAVAILABLE, problem)
    quiet = [
        condition(t, "False", f"KubeletHas{r}", f"no {t}")
        for t, r in (
            ("MemoryPressure", "SufficientMemory"),
            ("DiskPressure", "NoDiskPressure"),
            ("PIDPressure", "SufficientPID"),
        )
    ]
    info = {
        "kubeletVersion": RUNTIME_VERSION,
        "containerRuntimeVersion": RUNTIME_VERSION,
        "operatingSystem": "linux",
        "architecture": "amd64",
    }
    info.update(
        {k: "" for k in ("machineID", "systemUUID", "bootID", "kernelVersion", "osImage", "kubeProxyVersion")}
    )
    return {
        "conditions": [ready, *quiet],
        "addresses": node_addresses(name),
        "nodeInfo": info,
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
    }


class NodeAgent:
    def __init__(self, host: Host, obj: dict[str, Any], problem: str | None) -> None:
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        self.host = host
        self.node = Node(
            obj["metadata"]["name"], spec.get("podCIDR", ""), dict(status.get("allocatable") or {})
        )
        self.uid = obj["metadata"]["uid"]
        self.problem = problem
        self.workers: dict[str, PodWorker] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    async def run(self) -> None:
        loops = [self._lease_loop(), self._status_loop()]
        if self.problem is None:
            loops.append(self._pods_loop())
        await asyncio.gather(*loops)

    async def shutdown(self, grace_s: float) -> None:
        await asyncio.gather(*(worker.shutdown(grace_s) for worker in self.workers.values()))
        for task in self.tasks.values():
            task.cancel()

    # -- heartbeats ----------------------------------------------------------------------------
    async def _status_loop(self) -> None:
        path = f"/api/v1/nodes/{self.node.name}/status"
        while True:
            with contextlib.suppress(KubeError, OSError, asyncio.TimeoutError):
                body = {"status": node_status(self.node.name, _now(), self.problem, self.host.kubelet_port)}
                await self.host.api.patch_path(path, body, STRATEGIC_MERGE_PATCH)
            await asyncio.sleep(STATUS_REPORT_S)

    async def _lease_loop(self) -> None:
        while True:
            try:
                await self._renew_lease()
            except (TimeoutError, KubeError, OSError) as error:
                log.warning("lease of node %s not renewed: %s", self.node.name, error)
            await asyncio.sleep(LEASE_RENEW_S)

    async def _renew_lease(self) -> None:
        path = f"{LEASES}/{self.node.name}"
        spec = {
            "holderIdentity": self.node.name,
            "leaseDurationSeconds": LEASE_DURATION_S,
            "renewTime": micro_time(_now()),
        }
        if await self.host.api.read_path(path) is not None:
            await self.host.api.patch_path(path, {"spec": spec})
            return
        owner = {"apiVersion": "v1", "kind": "Node", "name": self.node.name, "uid": self.uid}
        metadata = {"name": self.node.name, "namespace": "kube-node-lease", "ownerReferences": [owner]}
        await self.host.api.create_path(
            LEASES,
            {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec},
        )

    # -- pods ----------------------------------------------------------------------------------
    async def _pods_loop(self) -> None:
        params = {"fieldSelector": f"spec.nodeName={self.node.name}"}
        async for event in watch(self.host.api, "/api/v1/pods", params):
            await self._on_pod(event)

    async def _on_pod(self, event: Event) -> None:
        obj = event.object
        uid = obj["metadata"]["uid"]
        worker = self.workers.get(uid)
        if event.type == "DELETED":
            if worker is not None:
                worker.forget()
            return
        if worker is not None:
            worker.update(obj)
            return
        phase = (obj.get("status") or {}).get("phase")
        if obj["metadata"].get("deletionTimestamp") and phase in ("Succeeded", "Failed"):
            await self._finalize(obj)
        elif phase not in ("Succeeded", "Failed"):
            self._admit(obj)

    def _admit(self, obj: dict[str, Any]) -> None:
        uid = obj["metadata"]["uid"]
        previous = (obj.get("status") or {}).get("podIP", "")
        used = {w.addresses.pod_ip for w in self.workers.values()}
        keep = previous and previous not in used and network.in_range(previous, self.node.pod_cidr)
        ip = (
            HOST_IP
            if (obj["spec"].get("hostNetwork"))
            else previous
            if keep
            else network.pick_ip(self.node.pod_cidr, used)
        )
        worker = PodWorker(self.host, self.node, obj, ip)
        self.workers[uid] = worker
        task = asyncio.create_task(worker.run())
        self.tasks[uid] = task
        task.add_done_callback(lambda done: self._retire(uid, done))

    def _retire(self, uid: str, task: asyncio.Task[None]) -> None:
        self.workers.pop(uid, None)
        self.tasks.pop(uid, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("pod worker %s failed", uid, exc_info=task.exception())

    async def _finalize(self, obj: dict[str, Any]) -> None:
        """A finished pod being deleted: nothing runs, so its object goes at once."""
        meta = obj["metadata"]
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        with contextlib.suppress(KubeError):
            await self.host.api.delete_path(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", body
            )


def _now() -> float:
    import time

    return time.time()
