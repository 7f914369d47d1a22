"""Command lines for each control-plane component, as pure functions of ports and file paths.

Kept apart from process handling so the flags (the part that breaks between Kubernetes
releases) are readable in one place and unit-tested without starting anything.
"""

from __future__ import annotations

import ipaddress
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


@dataclass(frozen=True)
class Networks:
    service_cidr: str = "10.96.0.0/16"
    pod_cidr: str = "10.244.0.0/16"

    @property
    def apiserver_service_ip(self) -> str:
        """The first address of the service range: the ``kubernetes`` Service's ClusterIP."""
        return str(next(ipaddress.ip_network(self.service_cidr).hosts()))


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


def controller_manager_argv(bin_dir: Path, layout: Layout, ports: Ports, networks: Networks) -> list[str]:
    pki = layout.pki
    return [
        str(bin_dir / "kube-controller-manager"),
        *_client_flags(layout.kubeconfig_for("system:kube-controller-manager")),
        *_serving_flags(layout, "kube-controller-manager", ports.controller_manager),
        # Every controller that is on by default: garbage collector, deployment, replicaset,
        # statefulset, disruption, horizontal-pod-autoscaling, serviceaccount, namespace, ...
        "--controllers=*",
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
        f"--cidr={networks.pod_cidr}",
        "--node-ip=127.0.0.1",
        # Without a KwokConfiguration this defaults to 0: no node Leases, and after the grace
        # period the node lifecycle controller taints every node unreachable (NoExecute).
        f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
        # At INFO kwok logs every status patch: a line per pod transition.
        "--v=WARN",
    ]
