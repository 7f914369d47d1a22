"""What keeps a tenant's blocks and its sidecar to itself where it shares a node or a volume.

- **Keys**: every block key is chained from a root salted with the tenant's cache namespace
  (``kv_connector.root_hash``), so the same prompt gives two tenants different keys.
- **The shared volume**: each tenant's blocks live in a directory of its own,
  ``<shared.path>/tenant-<hash of the cache namespace>`` (the name says nothing about whose it
  is), mode 0700, its files 0600; the sidecar never opens a path outside it.
- **The socket**: mode 0600 in the pod's own directory, and a connecting process must run as
  the sidecar's own user (``SO_PEERCRED``), as the engine beside it does.

Pure decisions (names, paths, the peer rule) and the few calls that apply them.
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
from pathlib import Path

TENANT_PREFIX = "tenant-"
PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600
# What the sidecar creates (the DRAM tier's slots, the NVMe files, the socket) is its user's.
PRIVATE_UMASK = 0o077
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


class OutsideTenant(PermissionError):
    """A path that would leave the tenant's directory (a link planted on the volume): an
    OSError, so the shared tier is skipped a while as for any volume it cannot use."""


def tenant_dir_name(tenant: str) -> str:
    """The directory of ``tenant`` (a cache namespace) on a shared volume: the same for every
    replica of every service of the tenant, another for every other tenant."""
    digest = hashlib.blake2b(f"strata-tenant-v1\0{tenant}".encode(), digest_size=16).hexdigest()
    return f"{TENANT_PREFIX}{digest}"


def tenant_root(volume: str | Path, tenant: str) -> Path:
    return Path(volume) / tenant_dir_name(tenant)


def inside(root: Path, path: Path) -> Path:
    """``path`` when it lies under ``root`` (after ``..`` and links are resolved), else
    :class:`OutsideTenant` naming both."""
    resolved, base = path.resolve(), root.resolve()
    if resolved != base and base not in resolved.parents:
        raise OutsideTenant(f"path {path} is outside the tenant directory {root}")
    return path


def make_private_dir(path: Path) -> Path:
    """Create ``path`` (and its parents) as a directory only its owner may enter."""
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o777 != PRIVATE_DIR:
        path.chmod(PRIVATE_DIR)
    return path


def socket_dir(path: Path) -> Path:
    """The socket's directory, made private where the sidecar owns it; a volume's root that
    another user owns (a kubelet's emptyDir) stays as it is, and the socket's mode guards it."""
    try:
        return make_private_dir(path)
    except PermissionError:
        return path


def peer_allowed(peer_uid: int, own_uid: int) -> bool:
    """Only a process of the sidecar's own user (the engine of its pod) may use its socket."""
    return peer_uid == own_uid


def peer_uid(sock: socket.socket) -> int:
    """The user of the process at the other end of a Unix socket, as the kernel recorded it."""
    _, uid, _ = _PEERCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    return int(uid)


def own_uid() -> int:
    return os.geteuid()
