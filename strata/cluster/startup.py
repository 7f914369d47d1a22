"""Starting a cluster: certificates, ports, the five components in order, GPU nodes, readiness.

Split from ``cluster`` so the handle tests use stays small; this module is only the start-up
sequence and its failure handling (stop whatever started, surface the failing component's log).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

from strata.cluster import certs, components, health, kubeconfig, processes, ranges, storage
from strata.cluster.binaries import REPO_ROOT, find_bin_dir
from strata.cluster.cluster import Cluster, ClusterConfig, ComponentExited

log = logging.getLogger(__name__)

KWOK_STAGES = Path(__file__).with_name("kwok-stages.yaml")
ADMIN_USER = "strata-admin"
PORT_ATTEMPTS = 3


class ClusterStartError(RuntimeError):
    """A component failed to start or become healthy; the message carries its log tail."""


def _free_ports(count: int) -> list[int]:
    # Hold every socket open until all are chosen so the kernel cannot hand out one port twice.
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


def _write_identities(layout: components.Layout, api_url: str) -> None:
    ca = certs.CertPair(layout.pki / "ca.crt", layout.pki / "ca.key")
    clients = layout.pki / "clients"
    identities = {
        "admin": (ADMIN_USER, ("system:masters",)),
        "system:kube-controller-manager": ("system:kube-controller-manager", ()),
        "system:kube-scheduler": ("system:kube-scheduler", ()),
        # KWOK and the pod runtime play every kubelet; node authorization would need one identity
        # per node.
        "kwok": ("kwok", ("system:masters",)),
        "pod-runtime": ("strata-pod-runtime", ("system:masters",)),
    }
    for identity, (user, groups) in identities.items():
        pair = certs.issue_client_cert(ca, clients, user, groups)
        path = layout.admin_kubeconfig if identity == "admin" else layout.kubeconfig_for(identity)
        kubeconfig.write_cert_kubeconfig(path, api_url, ca.cert, pair, user)
    for component in ("kube-controller-manager", "kube-scheduler"):
        certs.issue_serving_cert(ca, layout.pki, component, "127.0.0.1")


def _wait_healthy(
    process: processes.ManagedProcess, url: str, context: ssl.SSLContext | None, deadline: float
) -> None:
    def check() -> bool:
        if not process.running():
            raise ClusterStartError(
                f"{process.name} exited with code {process.popen.returncode}; log {process.log_path}:\n"
                + process.log_tail()
            )
        return health.is_healthy(url, context)

    try:
        processes.wait_until(check, max(deadline - time.monotonic(), 0.0), f"{process.name} at {url}")
    except TimeoutError as error:
        raise ClusterStartError(f"{error}; log {process.log_path}:\n{process.log_tail()}") from None


def _start_components(
    bin_dir: Path,
    layout: components.Layout,
    networks: components.Networks,
    ports: components.Ports,
    deadline: float,
    started: list[processes.ManagedProcess],
) -> None:
    def start(name: str, argv: list[str], env: dict[str, str] | None = None) -> processes.ManagedProcess:
        process = processes.start_process(name, argv, layout.logs / f"{name}.log", env)
        started.append(process)
        return process

    pki = certs.CertPair(layout.pki / "ca.crt", layout.pki / "ca.key")
    tls = health.tls_context(pki.cert)
    etcd = start("etcd", components.etcd_argv(bin_dir, layout, ports))
    _wait_healthy(etcd, f"http://127.0.0.1:{ports.etcd_client}/health", None, deadline)
    apiserver = start("kube-apiserver", components.apiserver_argv(bin_dir, layout, ports, networks))
    _wait_healthy(apiserver, f"https://127.0.0.1:{ports.apiserver}/readyz", tls, deadline)
    kcm = start(
        "kube-controller-manager", components.controller_manager_argv(bin_dir, layout, ports, networks)
    )
    scheduler = start("kube-scheduler", components.scheduler_argv(bin_dir, layout, ports))
    kwok = start("kwok", components.kwok_argv(bin_dir, layout, networks, KWOK_STAGES))
    # The runtime, and the pods it runs, import this checkout of strata whatever is installed.
    start("pod-runtime", components.pod_runtime_argv(layout, networks), pod_runtime_env())
    _wait_healthy(kcm, f"https://127.0.0.1:{ports.controller_manager}/healthz", tls, deadline)
    _wait_healthy(scheduler, f"https://127.0.0.1:{ports.scheduler}/healthz", tls, deadline)
    if not kwok.running():
        raise ClusterStartError(f"kwok exited; log {kwok.log_path}:\n{kwok.log_tail()}")


def pod_runtime_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), path) if p)}


def _wait_default_service_account(cluster: Cluster, deadline: float) -> None:
    # The serviceaccount controller creating `default` proves kube-controller-manager is working;
    # until it exists, the ServiceAccount admission plugin rejects every pod in the namespace.
    def exists() -> bool:
        return (
            cluster.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0
        )

    processes.wait_until(exists, max(deadline - time.monotonic(), 0.0), "the default ServiceAccount")


def launch(directory: Path, config: ClusterConfig | None = None, bin_dir: Path | None = None) -> Cluster:
    """Start a cluster whose files live in ``directory`` and return once its nodes are Ready.

    Without ``config.networks`` the cluster takes a pod range no other cluster on this machine
    holds, until it stops. On any failure every process already started is stopped (and the
    range released) before the error propagates.
    """
    config = config or ClusterConfig()
    bin_dir = bin_dir or find_bin_dir()
    lock, networks = None, config.networks
    if networks is None:
        lock = ranges.reserve()
        networks = components.Networks(pod_cidr=lock.cidr)
    try:
        cluster = _launch(directory, config, networks, bin_dir)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    cluster.hold_range(lock)
    return cluster


def _launch(directory: Path, config: ClusterConfig, networks: components.Networks, bin_dir: Path) -> Cluster:
    began = time.monotonic()
    layout = components.Layout(directory.resolve())
    for path in (layout.root, layout.logs, layout.kubeconfigs):
        path.mkdir(parents=True, exist_ok=True)
    certs.create_pki(layout.pki, networks.apiserver_service_ip)
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            cluster = _launch_once(bin_dir, layout, config, networks, began + config.start_timeout_s)
            break
        except ClusterStartError as error:
            # A free port can be taken between choosing it and the component binding it (by
            # another test cluster or an outgoing connection); choose again.
            if "address already in use" not in str(error) or attempt == PORT_ATTEMPTS:
                raise
            log.warning("port taken while starting, retrying", extra={"attempt": attempt})
    cluster.startup_s = round(time.monotonic() - began, 1)
    _write_state(layout, cluster)
    log.info("cluster ready", extra={"api_url": cluster.api_url, "startup_s": cluster.startup_s})
    return cluster


def _launch_once(
    bin_dir: Path,
    layout: components.Layout,
    config: ClusterConfig,
    networks: components.Networks,
    deadline: float,
) -> Cluster:
    shutil.rmtree(layout.etcd_data, ignore_errors=True)  # etcd records its peer URL (a port) in its data
    layout.etcd_data.mkdir()
    ports = components.Ports(*_free_ports(5))
    api_url = f"https://127.0.0.1:{ports.apiserver}"
    _write_identities(layout, api_url)
    started: list[processes.ManagedProcess] = []
    try:
        _start_components(bin_dir, layout, networks, ports, deadline, started)
        cluster = Cluster(layout.root, bin_dir, api_url, owned=started, networks=networks)
        cluster.add_gpu_nodes(config.gpu_nodes, config.node_shape, config.node_prefix)
        cluster.add_local_nodes(
            config.local_nodes, config.local_node_shape, config.local_node_cpu, config.local_node_prefix
        )
        cluster.add_storage_class(storage.DEFAULT_STORAGE_CLASS, default=True)
        _wait_default_service_account(cluster, deadline)
    except BaseException as error:
        for process in reversed(started):
            process.stop()
        if isinstance(error, ComponentExited | TimeoutError):  # a dead or slow component: retried
            raise ClusterStartError(str(error)) from error
        raise
    return cluster


def _write_state(layout: components.Layout, cluster: Cluster) -> None:
    state = {
        "api_url": cluster.api_url,
        "bin_dir": str(cluster.bin_dir),
        "kubeconfig": str(cluster.kubeconfig),
        "startup_s": cluster.startup_s,
        "pids": {process.name: process.pid for process in cluster.owned_processes},
        "networks": dataclasses.asdict(cluster.networks),
    }
    layout.state.write_text(json.dumps(state, indent=2) + "\n")


@contextlib.contextmanager
def start_cluster(
    directory: Path, config: ClusterConfig | None = None, bin_dir: Path | None = None
) -> Iterator[Cluster]:
    """``with start_cluster(tmp) as cluster:`` -- stopped on exit, also on errors and Ctrl-C."""
    cluster = launch(directory, config, bin_dir)
    try:
        yield cluster
    finally:
        cluster.stop()
