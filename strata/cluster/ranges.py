"""A pod range of its own for each cluster running on this machine.

Pod IPs are loopback addresses that local pods really bind (and that tests bind to stand in for
KWOK pods), so two clusters on one machine (two engineers' test sessions, a demo next to a test
run) must never hand out the same ones. Each cluster takes one /16 of 127.64.0.0/10 and holds an
advisory lock on it for its life: the lock goes with the process holding it, whatever ends it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from strata.cluster.locks import try_lock

POOL = "127.64.0.0/10"
RANGE_PREFIX = 16
LOCK_DIR = Path(tempfile.gettempdir()) / "strata-pod-ranges"


class NoFreeRangeError(RuntimeError):
    """Every /16 of the pool is held by another cluster on this machine."""


@dataclass
class RangeLock:
    cidr: str
    fd: int

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def candidates(pool: str = POOL) -> list[str]:
    return [str(net) for net in ipaddress.ip_network(pool).subnets(new_prefix=RANGE_PREFIX)]


def reserve(lock_dir: Path = LOCK_DIR, pool: str = POOL) -> RangeLock:
    """The lowest /16 of ``pool`` no other cluster on this machine holds, locked until released
    (or until this process ends)."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(PermissionError):
        lock_dir.chmod(0o1777)  # shared by every user's clusters, like /tmp
    for cidr in candidates(pool):
        fd = try_lock(lock_dir / f"{cidr.replace('/', '_')}.lock")
        if fd is not None:
            return RangeLock(cidr, fd)
    raise NoFreeRangeError(f"all {len(candidates(pool))} pod ranges of {pool} are held by other clusters")
