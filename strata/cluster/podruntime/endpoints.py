"""Which pod a connection to a Service's ClusterIP goes to (pure): the role of the endpoints
controller and kube-proxy, for the pods this runtime runs.

A Service's endpoints for one of its ports are the Ready, not terminating pods of its namespace
that its selector matches, at the port its ``targetPort`` names (a number, or a container port's
name; a pod without that name is left out, as the endpoints controller does). Only loopback
addresses are ever used: the proxy listens on no ClusterIP outside the cluster's Service range or
127.0.0.0/8, and connects to no pod IP outside 127.0.0.0/8 (``split_loopback``).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from strata.cluster.podruntime.services import Service, ServicePort

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


@dataclass(frozen=True)
class PodEndpoint:
    """What the proxy needs to know of a pod this runtime runs."""

    namespace: str
    labels: Mapping[str, str]
    ip: str
    ready: bool
    terminating: bool
    ports: Mapping[str, int]  # named TCP container ports


@dataclass(frozen=True)
class Listener:
    """A ClusterIP:port the proxy listens on, and the Service port behind it."""

    namespace: str
    service: str
    ip: str
    port: int


def is_loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip) in LOOPBACK
    except ValueError:
        return False


def in_network(ip: str, cidr: str) -> bool:
    try:
        return ipaddress.ip_address(ip) in ipaddress.ip_network(cidr)
    except ValueError:
        return False


def listeners(service: Service, service_cidr: str) -> tuple[list[Listener], str | None]:
    """The TCP ports to listen on for ``service``, and why none when it is refused: a ClusterIP
    outside the cluster's loopback Service range is never listened on."""
    ip = service.spec.cluster_ip
    if not service.has_cluster_ip or not service.spec.selector:
        return [], None  # headless, ExternalName, or endpoints managed by hand: nothing to proxy
    if not (is_loopback(ip) and in_network(ip, service_cidr)):
        return [], f"ClusterIP {ip} is outside the loopback Service range {service_cidr}"
    namespace, name = service.key
    ports = [p.port for p in service.spec.ports if p.protocol == "TCP"]
    return [Listener(namespace, name, ip, port) for port in ports], None


def target_port(port: ServicePort, pod: PodEndpoint) -> int | None:
    target = port.port if port.target_port is None else port.target_port
    if isinstance(target, int):
        return target
    return int(target) if target.isdigit() else pod.ports.get(target)


def endpoints(service: Service, port: int, pods: Iterable[PodEndpoint]) -> list[tuple[str, int]]:
    """(pod IP, port) of every pod that serves ``service`` on ``port``, sorted (stable order for
    the round robin). Pod IPs outside 127.0.0.0/8 are among them: ``split_loopback`` refuses them."""
    spec = next((p for p in service.spec.ports if p.port == port and p.protocol == "TCP"), None)
    if spec is None or not service.spec.selector:
        return []
    found: list[tuple[str, int]] = []
    for pod in pods:
        selected = all(pod.labels.get(k) == v for k, v in service.spec.selector.items())
        if pod.namespace != service.metadata.namespace or not selected:
            continue
        number = target_port(spec, pod)
        if pod.ready and not pod.terminating and number is not None:
            found.append((pod.ip, number))
    return sorted(set(found))


def split_loopback(found: list[tuple[str, int]]) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """(the endpoints the proxy may connect to, those it refuses: outside 127.0.0.0/8)."""
    return [e for e in found if is_loopback(e[0])], [e for e in found if not is_loopback(e[0])]


def pick(candidates: list[tuple[str, int]], turn: int) -> list[tuple[str, int]]:
    """The endpoints in the order to try them for connection number ``turn``: round robin, the
    others after as fallbacks."""
    if not candidates:
        return []
    start = turn % len(candidates)
    return candidates[start:] + candidates[:start]
