"""Command lines for each control-plane component, as pure functions of ports and file paths.

Kept apart from process handling so the flags (the part that breaks between Kubernetes
releases) are readable in one place and unit-tested without starting anything.
"""

from __future__ import annotations

import ipaddress
import sys
from dataclasses import dataclass
from pathlib import Path

# Components log at warning level and up: at INFO the apiserver alone writes megabytes per minute.
LOG_LEVEL = "1"
NODE_LEASE_SECONDS = 40


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int


@dataclass(frozen=True)
class Layout:
    """Where one cluster's files live inside its directory."""

    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd-data"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pod_runtime(self) -> Path:
        """The local pod runtime's state: each pod's volumes and launch specs."""
        return self.root / "pod-runtime"

    @property
    def pod_logs(self) -> Path:
        """Container logs of the local pod runtime: ``<namespace>_<pod>_<uid>/<container>/<n>.log``."""
        return self.logs / "pods"

    @property
    def kubeconfigs(self) -> Path:
        return self.root / "kubeconfigs"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    def kubeconfig_for(self, identity: str) -> Path:
        return self.kubeconfigs / f"{identity.replace(':', '_').replace('/', '_')}.kubeconfig"

    def serving_cert(self, component: str) -> tuple[Path, Path]:
        return self.pki / f"{component}.crt", self.pki / f"{component}.key"


LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


@dataclass(frozen=True)
class Networks:
    """Every address the test control plane hands out is a loopback address: a pod IP is one a
    local process can bind and that no other host on any network can be, and a Service ClusterIP
    goes nowhere (there is no kube-proxy), so nothing run against the cluster can dial out."""

    service_cidr: str = "127.96.0.0/16"
    pod_cidr: str = "127.64.0.0/16"
    node_prefix_length: int = 24

    def __post_init__(self) -> None:
        for name in ("service_cidr", "pod_cidr"):
            value = getattr(self, name)
            try:
                network = ipaddress.ip_network(value)
            except ValueError as error:
                raise ValueError(f"Networks.{name}: {error}") from None
            if not network.subnet_of(LOOPBACK):  # type: ignore[arg-type]
                raise ValueError(f"Networks.{name}: {value} is outside 127.0.0.0/8 (loopback only)")
        if not ipaddress.ip_network(self.pod_cidr).prefixlen < self.node_prefix_length <= 30:
            raise ValueError(
                f"Networks.node_prefix_length: must be longer than pod_cidr's and <= 30, "
                f"got {self.node_prefix_length}"
            )

    @property
    def apiserver_service_ip(self) -> str:
        """The first address of the service range: the ``kubernetes`` Service's ClusterIP."""
        return str(next(ipaddress.ip_network(self.service_cidr).hosts()))

    def node_cidrs(self) -> list[str]:
        """The per-node pod ranges, in order of allocation. The first one is kept back: KWOK
        hands out its addresses to pods of nodes created without a ``spec.podCIDR``."""
        subnets = ipaddress.ip_network(self.pod_cidr).subnets(new_prefix=self.node_prefix_length)
        return [str(subnet) for subnet in subnets]

    @property
    def unassigned_node_cidr(self) -> str:
        return self.node_cidrs()[0]

    def allocate_node_cidrs(self, used: set[str], count: int) -> list[str]:
        """``count`` node ranges not in ``used``, lowest first; ValueError when the range is full."""
        free = [cidr for cidr in self.node_cidrs()[1:] if cidr not in used][:count]
        if len(free) < count:
            raise ValueError(
                f"Networks.pod_cidr: {self.pod_cidr} holds no {count} more /{self.node_prefix_length} "
                f"node ranges ({len(used)} in use)"
            )
        return free


def etcd_argv(bin_dir: Path, layout: Layout, ports: Ports) -> list[str]:
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        str(bin_dir / "etcd"),
        "--name=default",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=default={peer}",
        # A test cluster's data is thrown away; fsync only costs seconds per test session.
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def apiserver_argv(bin_dir: Path, layout: Layout, ports: Ports, networks: Networks) -> list[str]:
    pki = layout.pki
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        # Endpoints may not hold loopback addresses, so the reconciler would fail every 10s.
        "--endpoint-reconciler-type=none",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--authorization-mode=Node,RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={networks.service_cidr}",
        # The aggregation layer, so APIService-backed APIs can be added and delegated authentication
        # in the controller-manager and scheduler finds a complete configuration.
        f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
        # `kubectl logs`: dial a node's (loopback) InternalIP, never its name (the machine's DNS
        # resolver), prove the API server with its kubelet client certificate and check the
        # kubelet's serving certificate against the cluster CA.
        "--kubelet-preferred-address-types=InternalIP",
        f"--kubelet-client-certificate={pki / 'kube-apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'kube-apiserver-kubelet-client.key'}",
        f"--kubelet-certificate-authority={pki / 'ca.crt'}",
        "--allow-privileged=true",
        "--profiling=false",
        f"--v={LOG_LEVEL}",
    ]


def _serving_flags(layout: Layout, component: str, port: int) -> list[str]:
    cert, key = layout.serving_cert(component)
    return [
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={cert}",
        f"--tls-private-key-file={key}",
    ]


def _client_flags(kubeconfig: Path) -> list[str]:
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
    ]


API_RATE_FLAGS = ("--kube-api-qps=100", "--kube-api-burst=200")
CONTROLLERS = (
    "*",
    "-endpoints-controller",
    "-endpointslice-controller",
    "-endpointslice-mirroring-controller",
)


def controller_manager_argv(bin_dir: Path, layout: Layout, ports: Ports, networks: Networks) -> list[str]:
    pki = layout.pki
    return [
        str(bin_dir / "kube-controller-manager"),
        *_client_flags(layout.kubeconfig_for("system:kube-controller-manager")),
        *_serving_flags(layout, "kube-controller-manager", ports.controller_manager),
        # Every controller that is on by default (garbage collector, deployment, replicaset,
        # statefulset, disruption, horizontal-pod-autoscaling, serviceaccount, namespace, ...) but
        # those publishing Endpoints and EndpointSlices: the apiserver refuses loopback addresses
        # in them, so these would retry every pod IP forever.
        f"--controllers={','.join(CONTROLLERS)}",
        # Each controller acts as its own ServiceAccount, as in kubeadm clusters, so RBAC gaps in
        # the bootstrap roles show up here too.
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
        f"--service-cluster-ip-range={networks.service_cidr}",
        # The default client rate (20/s, burst 30) makes the controller-manager, not the code under
        # test, the bottleneck of anything creating hundreds of pods (the operator benchmark).
        *API_RATE_FLAGS,
        # KWOK renews its fake nodes' leases through the same API server. Saturated (the operator
        # benchmark's 1,000-service burst on a small machine), a renewal can lag past the default
        # 50 s; the node controller would then mark every pod on the node NotReady, which KWOK's
        # pod-ready stage cannot undo (it re-patches the immutable podIPs), so services never
        # became Ready again. A real node that stops renewing for 5 minutes is still noticed.
        "--node-monitor-grace-period=5m",
        "--leader-elect=false",
        "--profiling=false",
        f"--v={LOG_LEVEL}",
    ]


def scheduler_argv(bin_dir: Path, layout: Layout, ports: Ports) -> list[str]:
    return [
        str(bin_dir / "kube-scheduler"),
        *_client_flags(layout.kubeconfig_for("system:kube-scheduler")),
        *_serving_flags(layout, "kube-scheduler", ports.scheduler),
        *API_RATE_FLAGS,
        "--leader-elect=false",
        "--profiling=false",
        f"--v={LOG_LEVEL}",
    ]


def kwok_argv(bin_dir: Path, layout: Layout, networks: Networks, stages: Path) -> list[str]:
    return [
        str(bin_dir / "kwok"),
        f"--kubeconfig={layout.kubeconfig_for('kwok')}",
        f"--config={stages}",
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        # Pods of a node with a spec.podCIDR get addresses from it; this range is for the others.
        f"--cidr={networks.unassigned_node_cidr}",
        "--node-ip=127.0.0.1",
        # Without a KwokConfiguration this defaults to 0: no node Leases, and after the grace
        # period the node lifecycle controller taints every node unreachable (NoExecute).
        f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
        # At INFO kwok logs every status patch: a line per pod transition.
        "--v=WARN",
    ]


def pod_runtime_argv(layout: Layout, networks: Networks) -> list[str]:
    cert, key = layout.serving_cert("kubelet")
    return [
        sys.executable,
        "-m",
        "strata.cluster.podruntime",
        f"--kubeconfig={layout.kubeconfig_for('pod-runtime')}",
        f"--root={layout.pod_runtime}",
        f"--logs={layout.pod_logs}",
        f"--service-cidr={networks.service_cidr}",
        f"--kubelet-cert={cert}",
        f"--kubelet-key={key}",
        f"--client-ca={layout.pki / 'ca.crt'}",
    ]
