"""``python -m strata.cluster.podruntime``: the local pod runtime, a component of the test cluster.

It plays the kubelet for every node labelled ``strata.dev/pod-runtime=local`` (KWOK leaves those
alone): the nodes' status and Leases, and a worker per pod bound to them that runs the pod's
containers as processes here. It runs in a private mount namespace of its own, so the
memory-backed volumes it mounts disappear with it. SIGTERM stops every container (within
``SHUTDOWN_GRACE_S``) and leaves the pod objects for the next runtime to take over.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import signal
import sys
import urllib.parse
from pathlib import Path
from typing import Any

from aiohttp import web

from strata.cluster.nodes import POD_RUNTIME_LABEL, POD_RUNTIME_LOCAL, machine_cpus
from strata.cluster.podruntime import capacity, events, kubeletapi, launch
from strata.cluster.podruntime.endpoints import LOOPBACK, PodEndpoint
from strata.cluster.podruntime.env import quantity
from strata.cluster.podruntime.host import SHUTDOWN_GRACE_S, Host, image_env
from strata.cluster.podruntime.images import Images, vllm_env_dir
from strata.cluster.podruntime.nodeagent import NodeAgent
from strata.cluster.podruntime.proxy import ServiceProxy
from strata.cluster.podruntime.spec import parse_pod
from strata.operator.kube import KubeClient
from strata.operator.kubewatch import watch

log = logging.getLogger("strata.cluster.podruntime")
REPO_ROOT = Path(__file__).resolve().parents[3]


def private_mount_namespace() -> str | None:
    """Move this process into a mount namespace of its own; the reason when it cannot (then its
    nodes report NotReady saying so, rather than running pods half-way)."""
    try:
        launch._check(launch.libc.unshare(launch.CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        launch.mount(None, "/", None, launch.MS_REC | launch.MS_PRIVATE)
    except OSError as error:
        return f"the local pod runtime needs mount namespaces (run as root): {error}"
    return None


class Runtime:
    def __init__(self, host: Host, problem: str | None, service_cidr: str) -> None:
        self.host = host
        self.problem = problem
        self.agents: dict[str, NodeAgent] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.pending: asyncio.Task[None] | None = None
        self.proxy = ServiceProxy(host.api, service_cidr, self._endpoints)
        self.proxying: asyncio.Task[None] | None = None

    async def run(self, stop: asyncio.Event) -> None:
        watching = asyncio.create_task(self._watch_nodes())
        await stop.wait()
        watching.cancel()
        log.info("stopping: %d nodes", len(self.agents))
        await asyncio.gather(*(agent.shutdown(SHUTDOWN_GRACE_S) for agent in self.agents.values()))
        for task in [*self.tasks.values(), *([self.pending] if self.pending else [])]:
            task.cancel()
        if self.proxying is not None:
            self.proxying.cancel()
            await asyncio.gather(self.proxying, return_exceptions=True)
        await self.host.session.close()
        await self.host.api.close()

    async def _watch_nodes(self) -> None:
        params = {"labelSelector": f"{POD_RUNTIME_LABEL}={POD_RUNTIME_LOCAL}"}
        async for event in watch(self.host.api, "/api/v1/nodes", params):
            name = event.object["metadata"]["name"]
            if event.type == "DELETED":
                await self._drop(name)
            elif name not in self.agents:
                self._adopt(event.object)

    def _adopt(self, obj: dict[str, Any]) -> None:
        agent = NodeAgent(self.host, obj, self.problem)
        name = agent.node.name
        log.info("running node %s (pod range %s)", name, agent.node.pod_cidr)
        self.agents[name] = agent
        self.tasks[name] = asyncio.create_task(agent.run())
        if self.pending is None:  # only with local nodes: a KWOK-only cluster pays nothing
            self.pending = asyncio.create_task(self._watch_pending())
            self.proxying = asyncio.create_task(self.proxy.run())

    def _endpoints(self) -> list[PodEndpoint]:
        return [w.endpoint() for a in self.agents.values() for w in a.workers.values()]

    async def _watch_pending(self) -> None:
        """Say, once per pod, why a pod meant for the local nodes waits for CPU."""
        warned: set[str] = set()
        params = {"fieldSelector": "spec.nodeName=,status.phase=Pending"}
        async for event in watch(self.host.api, "/api/v1/pods", params):
            uid = event.object["metadata"]["uid"]
            if event.type == "DELETED" or uid in warned:
                continue
            message = self._shortage(event.object)
            if message is not None:
                warned.add(uid)
                ref = events.pod_ref(
                    event.object["metadata"]["namespace"], event.object["metadata"]["name"], uid
                )
                await events.emit(
                    self.host.api, ref, "InsufficientLocalCPU", message, "local-nodes", warning=True
                )

    def _shortage(self, obj: dict[str, Any]) -> str | None:
        conditions = (obj.get("status") or {}).get("conditions") or []
        offered = sum(quantity(a.node.allocatable.get("cpu", "0")) for a in self.agents.values())
        pods = [w.pod for a in self.agents.values() for w in a.workers.values()]
        return capacity.shortage_message(
            parse_pod(obj), conditions, offered, capacity.requested(pods), machine_cpus()
        )

    async def _drop(self, name: str) -> None:
        agent = self.agents.pop(name, None)
        if agent is not None:
            await agent.shutdown(SHUTDOWN_GRACE_S)
            self.tasks.pop(name).cancel()


def _loopback_network(text: str) -> str:
    try:
        network = ipaddress.ip_network(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if not network.subnet_of(LOOPBACK):  # type: ignore[arg-type]
        raise argparse.ArgumentTypeError(f"{text} is outside 127.0.0.0/8 (loopback only)")
    return str(network)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m strata.cluster.podruntime", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--kubeconfig", type=Path, required=True, help="the runtime's own identity")
    parser.add_argument("--root", type=Path, required=True, help="state: pod volumes and launch specs")
    parser.add_argument("--logs", type=Path, required=True, help="container logs (<pod>/<container>/<n>.log)")
    parser.add_argument(
        "--service-cidr",
        type=_loopback_network,
        default="127.96.0.0/16",
        help="the cluster's Service range (loopback only): the proxy listens on these ClusterIPs",
    )
    parser.add_argument("--kubelet-cert", type=Path, help="serving certificate of the kubelet endpoint")
    parser.add_argument("--kubelet-key", type=Path, help="its key")
    parser.add_argument("--client-ca", type=Path, help="the CA that signs the API server's client cert")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace, problem: str | None) -> None:
    api = KubeClient.from_kubeconfig(args.kubeconfig)
    port = urllib.parse.urlsplit(api.server).port or 443
    images = Images(image_env(port), vllm_env_dir(REPO_ROOT))
    kubelet, kubelet_port = await _serve_kubelet(args)
    host = Host(api, REPO_ROOT, args.root.resolve(), args.logs.resolve(), images, kubelet_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    try:
        await Runtime(host, problem, args.service_cidr).run(stop)
    finally:
        if kubelet is not None:
            await kubelet.cleanup()


async def _serve_kubelet(args: argparse.Namespace) -> tuple[web.AppRunner | None, int]:
    """The kubelet's log endpoint, when the runtime was given its certificates."""
    if not (args.kubelet_cert and args.kubelet_key and args.client_ca):
        return None, 0
    context = kubeletapi.server_context(args.kubelet_cert, args.kubelet_key, args.client_ca)
    files = kubeletapi.LogFiles(args.logs.resolve(), args.root.resolve() / "pods")
    runner, port = await kubeletapi.serve(files, context)
    log.info("kubelet endpoint on %s:%d", kubeletapi.LISTEN_HOST, port)
    return runner, port


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    problem = private_mount_namespace()  # first: unshare(CLONE_NEWNS) refuses multi-threaded callers
    if problem:
        log.error("%s", problem)
    args = parse_args(argv)
    for path in (args.root, args.logs):
        path.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args, problem))
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
