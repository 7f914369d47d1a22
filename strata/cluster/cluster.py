"""The ``Cluster`` handle every test suite uses (``strata.cluster.startup`` creates one).

A cluster is a directory (certificates, kubeconfigs, logs, etcd data, ``state.json``) plus the
processes serving it. Tests talk to it through kubectl and per-identity kubeconfig files, the
same way a user or the operator's Helm chart would, rather than through an in-process client.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata.cluster import certs, components, kubeconfig, nodes, podfiles, processes, ranges, storage

# Bounds of waits that normally take seconds: generous, because a loaded or slow machine (CI,
# several engineers sharing two cores) takes many times longer; every wait returns on its event.
KUBECTL_TIMEOUT_S = 300.0
NODES_READY_S = 300.0
# For the harness's own generated objects: client-side validation fetches the apiserver's whole
# OpenAPI document first, which alone can take over kubectl's 32 s on a loaded machine.
TRUSTED = ("--validate=false",)


class ComponentExited(RuntimeError):
    """A component of the cluster exited; what was waited for will not happen."""


class NodeUnavailable(RuntimeError):
    """A node says it cannot run pods (its Ready condition's reason is a runtime failure)."""


class KubectlError(subprocess.CalledProcessError):
    """kubectl exited non-zero; unlike CalledProcessError, str() includes kubectl's stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstderr: {(self.stderr or '').strip()}"


@dataclass(frozen=True)
class ClusterConfig:
    """``gpu_nodes`` KWOK nodes (pods only pretend to run) and ``local_nodes`` nodes whose pods the
    local pod runtime runs as processes here, each offering ``local_node_cpu`` CPUs (a quantity
    such as "2" or "1500m"; None: the CPUs this machine gives the cluster)."""

    gpu_nodes: int = 4
    node_shape: nodes.GpuNodeShape = field(default_factory=nodes.GpuNodeShape)
    node_prefix: str = "gpu-node"
    # None: a pod range of its own, a /16 no other cluster on this machine holds (ranges.py).
    networks: components.Networks | None = None
    start_timeout_s: float = 300.0
    local_nodes: int = 0
    local_node_cpu: str | None = None
    local_node_shape: nodes.GpuNodeShape = field(default_factory=nodes.local_node_shape)
    local_node_prefix: str = "local-node"

    def __post_init__(self) -> None:
        for name in ("gpu_nodes", "local_nodes"):
            if getattr(self, name) < 0:
                raise ValueError(f"ClusterConfig.{name}: must be >= 0, got {getattr(self, name)}")
        for name in ("node_prefix", "local_node_prefix"):
            if not re.fullmatch(DNS_LABEL, getattr(self, name)):
                raise ValueError(f"ClusterConfig.{name}: not a DNS label: {getattr(self, name)!r}")
        if self.node_prefix == self.local_node_prefix:
            raise ValueError("ClusterConfig.local_node_prefix: must differ from node_prefix")
        if self.local_node_cpu is not None:
            check_cpu_quantity(self.local_node_cpu, "ClusterConfig.local_node_cpu")


DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


def check_cpu_quantity(value: str, what: str) -> str:
    """``value`` when it is a positive CPU quantity ("2", "0.5", "1500m"); ValueError otherwise."""
    if not re.fullmatch(r"(\d+(\.\d+)?|\d+m)", value) or float(value.rstrip("m")) <= 0:
        raise ValueError(f"{what}: not a positive CPU quantity such as '2' or '1500m': {value!r}")
    return value


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
        networks: components.Networks | None = None,
    ) -> None:
        self.directory = directory
        self.layout = components.Layout(directory)
        self.bin_dir = bin_dir
        self.api_url = api_url
        self.kubeconfig = self.layout.admin_kubeconfig
        self.startup_s = startup_s
        self.networks = networks or components.Networks()
        self._owned = list(owned)
        self._range_lock: ranges.RangeLock | None = None

    @classmethod
    def attach(cls, directory: Path) -> Cluster:
        """A handle on a cluster another process runs (``strata cluster up``); ``stop`` is a no-op."""
        directory = directory.resolve()
        state = read_state(directory)
        networks = components.Networks(**state["networks"]) if "networks" in state else None
        return cls(
            directory,
            Path(state["bin_dir"]),
            state["api_url"],
            startup_s=state.get("startup_s"),
            networks=networks,
        )

    @property
    def owned_processes(self) -> list[processes.ManagedProcess]:
        """The component processes this handle owns (empty for an attached cluster)."""
        return list(self._owned)

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
        timeout_s: float = NODES_READY_S,
    ) -> list[str]:
        """Create ``count`` more KWOK GPU nodes (numbered after the existing ones); their names."""
        shape = shape or nodes.GpuNodeShape()

        def manifest(name: str, index: int, cidr: str) -> dict[str, Any]:
            return nodes.gpu_node_manifest(name, index, shape, cidr)

        return self._add_nodes(count, prefix, manifest, wait, timeout_s)

    def add_local_nodes(
        self,
        count: int,
        shape: nodes.GpuNodeShape | None = None,
        cpu: str | None = None,
        prefix: str = "local-node",
        wait: bool = True,
        timeout_s: float = NODES_READY_S,
    ) -> list[str]:
        """Create ``count`` more nodes whose pods the local pod runtime runs as real processes,
        each offering ``cpu`` (default: this machine's CPUs) and this machine's memory."""
        shape = shape or nodes.local_node_shape()
        cpu = check_cpu_quantity(cpu, "cpu") if cpu is not None else str(nodes.machine_cpus())
        memory = nodes.machine_memory()

        def manifest(name: str, index: int, cidr: str) -> dict[str, Any]:
            return nodes.local_node_manifest(name, index, shape, cidr, cpu, memory)

        return self._add_nodes(count, prefix, manifest, wait, timeout_s)

    def _add_nodes(
        self,
        count: int,
        prefix: str,
        manifest: Callable[[str, int, str], dict[str, Any]],
        wait: bool,
        timeout_s: float,
    ) -> list[str]:
        if count < 0:
            raise ValueError(f"count: must be >= 0, got {count}")
        if count == 0:
            return []
        existing = [int(n.rsplit("-", 1)[1]) for n in self.node_names(prefix)]
        start = max(existing, default=-1) + 1
        cidrs = self.networks.allocate_node_cidrs(self._node_cidrs_in_use(), count)
        items = [
            manifest(nodes.node_name(prefix, start + i), start + i, cidr) for i, cidr in enumerate(cidrs)
        ]
        self.kubectl(
            "create", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        )
        names = [item["metadata"]["name"] for item in items]
        if wait:
            self.wait_nodes_ready(names, timeout_s)
        return names

    def _node_cidrs_in_use(self) -> set[str]:
        listed = self.kubectl("get", "nodes", "-o", "jsonpath={.items[*].spec.podCIDR}").stdout
        return set(listed.split())

    def add_storage_class(
        self, name: str, default: bool = False, binding_mode: storage.BindingMode = "Immediate"
    ) -> None:
        """A StorageClass whose claims KWOK provisions and binds (cluster-scoped: delete it after)."""
        manifest = json.dumps(storage.storage_class_manifest(name, default, binding_mode))
        self.kubectl("apply", *TRUSTED, "-f", "-", input=manifest)

    def wait_nodes_ready(self, names: Sequence[str], timeout_s: float = NODES_READY_S) -> None:
        """Until every node in ``names`` is Ready; ComponentExited or NodeUnavailable at once when
        a component this handle runs has exited or a node says it cannot run pods."""

        def ready() -> bool:
            self.check_components()
            listed = self.kubectl("get", "nodes", *names, "-o", "json", check=False)
            got = json.loads(listed.stdout) if listed.returncode == 0 else {"items": []}
            found = got.get("items", [got])  # one name: the Node itself, not a List
            for node in found:
                if (problem := nodes.node_problem(node)) is not None:
                    raise NodeUnavailable(f"node {node['metadata']['name']}: {problem}")
            return len(found) == len(names) and all(nodes.node_ready(n) for n in found)

        processes.wait_until(ready, timeout_s, f"nodes {', '.join(names)} Ready", interval_s=1.0)

    def check_components(self) -> None:
        """ComponentExited, with its log's last lines, for a component of this handle that exited."""
        for process in self._owned:
            if not process.running():
                raise ComponentExited(
                    f"{process.name} exited with code {process.popen.returncode}; "
                    f"log {process.log_path}:\n{process.log_tail()}"
                )

    def hold_range(self, lock: ranges.RangeLock | None) -> None:
        """Keep this cluster's pod range reserved until ``stop``."""
        self._range_lock = lock

    def container_log(self, namespace: str, pod: str, container: str, previous: bool = False) -> str:
        """What a container of the local pod runtime printed (its current run, or the previous one)."""
        return podfiles.container_log(self.layout.pod_logs, namespace, pod, container, previous)

    def container_pid(self, namespace: str, pod: str, container: str) -> int | None:
        """The host pid of a local pod's running container (for fault tests); None when not running."""
        return podfiles.container_pid(self.layout.pod_runtime / "pods", namespace, pod, container)

    def restart_component(self, name: str) -> processes.ManagedProcess:
        """Start component ``name`` again with its original command line and environment (fault
        tests kill one, then check what the new one does); the old one is stopped if it runs."""
        old = next((p for p in self._owned if p.name == name), None)
        if old is None:
            raise KeyError(f"no component {name!r} owned by this handle")
        old.stop()
        new = processes.start_process(name, old.argv, old.log_path, old.env)
        self._owned[self._owned.index(old)] = new
        return new

    def stop(self) -> None:
        """Stop the processes this handle started (newest first); the directory is left for its logs."""
        for process in reversed(self._owned):
            process.stop()
        self._owned.clear()
        if self._range_lock is not None:  # only once nothing uses the range any more
            self._range_lock.release()

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
