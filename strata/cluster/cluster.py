"""The ``Cluster`` handle every test suite uses, and ``launch``/``start_cluster`` that create one.

A cluster is a directory (certificates, kubeconfigs, logs, etcd data, ``state.json``) plus the
processes serving it. Tests talk to it through kubectl and per-identity kubeconfig files, the
same way a user or the operator's Helm chart would, rather than through an in-process client.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata.cluster import certs, components, health, kubeconfig, nodes, processes
from strata.cluster.binaries import find_bin_dir

log = logging.getLogger(__name__)

KWOK_STAGES = Path(__file__).with_name("kwok-stages.yaml")
ADMIN_USER = "strata-admin"
KUBECTL_TIMEOUT_S = 120.0


class ClusterStartError(RuntimeError):
    """A component failed to start or become healthy; the message carries its log tail."""


class KubectlError(subprocess.CalledProcessError):
    """kubectl exited non-zero; unlike CalledProcessError, str() includes kubectl's stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstderr: {(self.stderr or '').strip()}"


@dataclass(frozen=True)
class ClusterConfig:
    gpu_nodes: int = 4
    node_shape: nodes.GpuNodeShape = field(default_factory=nodes.GpuNodeShape)
    node_prefix: str = "gpu-node"
    networks: components.Networks = field(default_factory=components.Networks)
    start_timeout_s: float = 180.0

    def __post_init__(self) -> None:
        if self.gpu_nodes < 0:
            raise ValueError(f"ClusterConfig.gpu_nodes: must be >= 0, got {self.gpu_nodes}")
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", self.node_prefix):
            raise ValueError(f"ClusterConfig.node_prefix: not a DNS label: {self.node_prefix!r}")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


class Cluster:
    """A running test cluster. ``kubeconfig`` is the admin identity (group system:masters)."""

    def __init__(
        self,
        directory: Path,
        bin_dir: Path,
        api_url: str,
        owned: Sequence[processes.ManagedProcess] = (),
        startup_s: float | None = None,
    ) -> None:
        self.directory = directory
        self.layout = components.Layout(directory)
        self.bin_dir = bin_dir
        self.api_url = api_url
        self.kubeconfig = self.layout.admin_kubeconfig
        self.startup_s = startup_s
        self._owned = list(owned)

    @classmethod
    def attach(cls, directory: Path) -> Cluster:
        """A handle on a cluster another process runs (``strata cluster up``); ``stop`` is a no-op."""
        state = read_state(directory)
        return cls(directory, Path(state["bin_dir"]), state["api_url"], startup_s=state.get("startup_s"))

    @property
    def ca_cert(self) -> Path:
        return self.layout.pki / "ca.crt"

    def env(self) -> dict[str, str]:
        """Variables that point kubectl, helm and the kubernetes client at this cluster."""
        return {"KUBECONFIG": str(self.kubeconfig)}

    def kubectl(
        self,
        *args: str,
        user_kubeconfig: Path | None = None,
        input: str | None = None,
        check: bool = True,
        timeout_s: float = KUBECTL_TIMEOUT_S,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl as admin (or as ``user_kubeconfig``); text output, KubectlError on failure."""
        argv = [
            str(self.bin_dir / "kubectl"),
            f"--kubeconfig={user_kubeconfig or self.kubeconfig}",
            f"--cache-dir={self.directory / '.kube-cache'}",
            *args,
        ]
        result = subprocess.run(
            argv, input=input, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, argv, result.stdout, result.stderr)
        return result

    def kubectl_json(self, *args: str, user_kubeconfig: Path | None = None) -> Any:
        """``kubectl <args> -o json``, parsed."""
        return json.loads(self.kubectl(*args, "-o", "json", user_kubeconfig=user_kubeconfig).stdout)

    def apply(self, manifest: dict[str, Any] | str, namespace: str | None = None) -> None:
        """``kubectl apply`` a manifest given as YAML text or a dict (a single object or a v1 List)."""
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        self.kubectl("apply", *(["-n", namespace] if namespace else []), "-f", "-", input=text)

    def user_kubeconfig(self, username: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig for ``username`` in ``groups``, by a client certificate signed by the CA."""
        stem = f"user-{_safe(username)}"
        if groups:
            stem += "-" + hashlib.sha256("\0".join(groups).encode()).hexdigest()[:8]
        pair = certs.issue_client_cert(self._ca(), self.layout.pki / "users", username, tuple(groups), stem)
        path = self.layout.kubeconfigs / f"{stem}.kubeconfig"
        return kubeconfig.write_cert_kubeconfig(path, self.api_url, self.ca_cert, pair, username)

    def service_account_kubeconfig(self, namespace: str, name: str, duration: str = "24h") -> Path:
        """A kubeconfig holding a TokenRequest token for ServiceAccount ``namespace/name``."""
        token = self.kubectl(
            "create", "token", name, "-n", namespace, f"--duration={duration}"
        ).stdout.strip()
        path = self.layout.kubeconfigs / f"sa-{_safe(namespace)}-{_safe(name)}.kubeconfig"
        return kubeconfig.write_token_kubeconfig(
            path, self.api_url, self.ca_cert, token, f"system:serviceaccount:{namespace}:{name}"
        )

    def node_names(self, prefix: str) -> list[str]:
        listed = self.kubectl("get", "nodes", "-o", "name").stdout.split()
        names = [n.removeprefix("node/") for n in listed]
        return [n for n in names if re.fullmatch(rf"{re.escape(prefix)}-\d+", n)]

    def add_gpu_nodes(
        self,
        count: int,
        shape: nodes.GpuNodeShape | None = None,
        prefix: str = "gpu-node",
        wait: bool = True,
        timeout_s: float = 120.0,
    ) -> list[str]:
        """Create ``count`` more fake GPU nodes (numbered after the existing ones); their names."""
        existing = [int(n.rsplit("-", 1)[1]) for n in self.node_names(prefix)]
        start = max(existing, default=-1) + 1
        manifest = nodes.gpu_nodes_manifest(prefix, start, count, shape or nodes.GpuNodeShape())
        names = [item["metadata"]["name"] for item in manifest["items"]]
        if not names:
            return []
        self.kubectl("create", "-f", "-", input=json.dumps(manifest))
        if wait:
            self.wait_nodes_ready(names, timeout_s)
        return names

    def wait_nodes_ready(self, names: Sequence[str], timeout_s: float = 120.0) -> None:
        self.kubectl(
            "wait",
            "--for=condition=Ready",
            f"--timeout={timeout_s:.0f}s",
            *(f"node/{n}" for n in names),
            timeout_s=timeout_s + 30,
        )

    def stop(self) -> None:
        """Stop the processes this handle started (newest first); the directory is left for its logs."""
        for process in reversed(self._owned):
            process.stop()
        self._owned.clear()

    def _ca(self) -> certs.CertPair:
        return certs.CertPair(self.layout.pki / "ca.crt", self.layout.pki / "ca.key")


def read_state(directory: Path) -> dict[str, Any]:
    path = components.Layout(directory).state
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path}: no cluster state here; start one with `strata cluster up`"
        ) from None
    return state


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
        # KWOK plays every kubelet; node authorization would need one identity per node.
        "kwok": ("kwok", ("system:masters",)),
    }
    for identity, (user, groups) in identities.items():
        pair = certs.issue_client_cert(ca, clients, user, groups)
        path = layout.admin_kubeconfig if identity == "admin" else layout.kubeconfig_for(identity)
        kubeconfig.write_cert_kubeconfig(path, api_url, ca.cert, pair, user)
    for component in ("kube-controller-manager", "kube-scheduler"):
        certs.issue_serving_cert(ca, layout.pki, component, "127.0.0.1")


def _wait_healthy(process: processes.ManagedProcess, url: str, context: Any, deadline: float) -> None:
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
    config: ClusterConfig,
    ports: components.Ports,
    deadline: float,
    started: list[processes.ManagedProcess],
) -> None:
    def start(name: str, argv: list[str]) -> processes.ManagedProcess:
        process = processes.start_process(name, argv, layout.logs / f"{name}.log")
        started.append(process)
        return process

    pki = certs.CertPair(layout.pki / "ca.crt", layout.pki / "ca.key")
    tls = health.tls_context(pki.cert)
    etcd = start("etcd", components.etcd_argv(bin_dir, layout, ports))
    _wait_healthy(etcd, f"http://127.0.0.1:{ports.etcd_client}/health", None, deadline)
    apiserver = start("kube-apiserver", components.apiserver_argv(bin_dir, layout, ports, config.networks))
    _wait_healthy(apiserver, f"https://127.0.0.1:{ports.apiserver}/readyz", tls, deadline)
    kcm = start(
        "kube-controller-manager", components.controller_manager_argv(bin_dir, layout, ports, config.networks)
    )
    scheduler = start("kube-scheduler", components.scheduler_argv(bin_dir, layout, ports))
    kwok = start("kwok", components.kwok_argv(bin_dir, layout, config.networks, KWOK_STAGES))
    _wait_healthy(kcm, f"https://127.0.0.1:{ports.controller_manager}/healthz", tls, deadline)
    _wait_healthy(scheduler, f"https://127.0.0.1:{ports.scheduler}/healthz", tls, deadline)
    if not kwok.running():
        raise ClusterStartError(f"kwok exited; log {kwok.log_path}:\n{kwok.log_tail()}")


def _wait_default_service_account(cluster: Cluster, deadline: float) -> None:
    # The serviceaccount controller creating `default` proves kube-controller-manager is working;
    # until it exists, the ServiceAccount admission plugin rejects every pod in the namespace.
    def exists() -> bool:
        return (
            cluster.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0
        )

    processes.wait_until(exists, max(deadline - time.monotonic(), 0.0), "the default ServiceAccount")


def launch(directory: Path, config: ClusterConfig | None = None, bin_dir: Path | None = None) -> Cluster:
    """Start a cluster whose files live in ``directory`` and return once its GPU nodes are Ready.

    On any failure every process already started is stopped before the error propagates.
    """
    config = config or ClusterConfig()
    bin_dir = bin_dir or find_bin_dir()
    began = time.monotonic()
    deadline = began + config.start_timeout_s
    layout = components.Layout(directory.resolve())
    for path in (layout.root, layout.logs, layout.etcd_data, layout.kubeconfigs):
        path.mkdir(parents=True, exist_ok=True)
    certs.create_pki(layout.pki, config.networks.apiserver_service_ip)
    ports = components.Ports(*_free_ports(5))
    api_url = f"https://127.0.0.1:{ports.apiserver}"
    _write_identities(layout, api_url)
    started: list[processes.ManagedProcess] = []
    try:
        _start_components(bin_dir, layout, config, ports, deadline, started)
        cluster = Cluster(layout.root, bin_dir, api_url, owned=started)
        cluster.add_gpu_nodes(config.gpu_nodes, config.node_shape, config.node_prefix)
        _wait_default_service_account(cluster, deadline)
    except BaseException:
        for process in reversed(started):
            process.stop()
        raise
    cluster.startup_s = round(time.monotonic() - began, 1)
    _write_state(layout, cluster, started)
    log.info("cluster ready", extra={"api_url": api_url, "startup_s": cluster.startup_s})
    return cluster


def _write_state(
    layout: components.Layout, cluster: Cluster, started: Sequence[processes.ManagedProcess]
) -> None:
    state = {
        "api_url": cluster.api_url,
        "bin_dir": str(cluster.bin_dir),
        "kubeconfig": str(cluster.kubeconfig),
        "startup_s": cluster.startup_s,
        "pids": {process.name: process.pid for process in started},
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
