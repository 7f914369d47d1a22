"""Pod IPs: the runtime plays the CNI, handing each pod the lowest free address of its node's
pod range (a loopback /24, so every pod IP is a local address its processes can bind)."""

from __future__ import annotations

import ipaddress
from collections.abc import Collection


class RangeExhaustedError(RuntimeError):
    """Every address of the node's pod range is in use."""


def pick_ip(cidr: str, used: Collection[str]) -> str:
    """The lowest address of ``cidr`` not in ``used``, skipping the network's first host (the
    gateway on a real node's bridge)."""
    hosts = ipaddress.ip_network(cidr).hosts()
    next(hosts, None)
    for address in hosts:
        if str(address) not in used:
            return str(address)
    raise RangeExhaustedError(f"pod range {cidr}: all {len(used)} addresses in use")


def in_range(ip: str, cidr: str) -> bool:
    try:
        return ipaddress.ip_address(ip) in ipaddress.ip_network(cidr)
    except ValueError:
        return False
