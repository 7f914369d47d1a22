"""A process of another user tries tenant A's sidecar socket: the socket's mode keeps it out, and
where the mode would let it in (a directory or socket made world-writable), the sidecar itself
refuses it, by the user the kernel says is at the other end (SO_PEERCRED). The engine beside the
sidecar runs as the sidecar's user and connects as before (every other KV-tier test)."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from strata.worker.kvtier import protocol
from strata.worker.kvtier.walls import peer_allowed

from .conftest import TENANT_A, StartTenant

NOBODY = 65534
REFUSED, DENIED, ANSWERED, TIMED_OUT, OTHER = 0, 13, 2, 3, 1
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")


def try_as_nobody(path: str) -> int:
    """Fork, become ``nobody``, connect and say hello; what happened, as the child's exit code."""
    pid = os.fork()
    if pid == 0:  # the child: only os._exit leaves it
        code = OTHER
        try:
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            code = _hello(path)
        except PermissionError:
            code = DENIED
        except (ConnectionResetError, BrokenPipeError):
            code = REFUSED
        except TimeoutError:
            code = TIMED_OUT
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _hello(path: str) -> int:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(path)
        protocol.send(sock, {"op": "hello", "block_bytes": 4096})
        return ANSWERED if sock.recv(4) else REFUSED


def test_the_socket_is_its_users_alone(start_tenant: StartTenant) -> None:
    path = Path(start_tenant("pod-a", TENANT_A).kvtier.socket_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def socket_in_open_directories(start_tenant: StartTenant, volume: Path) -> Path:
    """A's socket, with its directories opened to everyone: only the socket stands in the way."""
    path = Path(start_tenant("pod-a", TENANT_A).kvtier.socket_path)
    for directory in (volume, path.parent):
        directory.chmod(0o755)
    return path


@needs_root
def test_another_user_cannot_connect_through_the_sockets_mode(
    start_tenant: StartTenant, volume: Path
) -> None:
    assert try_as_nobody(str(socket_in_open_directories(start_tenant, volume))) == DENIED


@needs_root
def test_another_user_let_in_by_the_mode_is_refused_by_the_sidecar(
    start_tenant: StartTenant, volume: Path
) -> None:
    path = socket_in_open_directories(start_tenant, volume)
    path.chmod(0o666)  # as if the socket's mode were lost: the peer check still holds
    assert try_as_nobody(str(path)) == REFUSED


def test_only_the_sidecars_own_user_is_a_peer() -> None:
    assert peer_allowed(10001, 10001)
    assert not peer_allowed(0, 10001)  # not even root: the engine beside the sidecar is its user
    assert not peer_allowed(10002, 10001)
