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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata.cluster import certs, components, kubeconfig, nodes, processes, storage

KUBECTL_TIMEOUT_S = 120.0


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
        directory = directory.resolve()
        state = read_state(directory)
        return cls(directory, Path(state["bin_dir"]), state["api_url"], startup_s=state.get("startup_s"))

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

    def add_storage_class(
        self, name: str, default: bool = False, binding_mode: storage.BindingMode = "Immediate"
    ) -> None:
        """A StorageClass whose claims KWOK provisions and binds (cluster-scoped: delete it after)."""
        self.apply(storage.storage_class_manifest(name, default, binding_mode))

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


def __getattr__(name: str) -> Any:
    # launch, start_cluster and ClusterStartError lived here before strata.cluster.startup; a lazy
    # lookup keeps old imports working without a circular import. Import them from strata.cluster.
    if name in ("launch", "start_cluster", "ClusterStartError"):
        from strata.cluster import startup

        return getattr(startup, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
