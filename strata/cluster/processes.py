"""Child processes that cannot outlive the harness.

Three layers, because each one alone has a hole:
- every child leads its own process group, so stopping it also stops anything it forked;
- ``PR_SET_PDEATHSIG`` makes the kernel SIGKILL the child when its parent dies, even by SIGKILL,
  where no Python handler runs (note: it fires when the *thread* that started the child exits,
  so start clusters from a long-lived thread such as the main thread);
- ``atexit`` and SIGTERM/SIGHUP handlers stop everything still registered on a normal or
  signalled exit (pytest turns Ctrl-C into KeyboardInterrupt, which runs fixture teardown).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 10.0

_live: dict[int, ManagedProcess] = {}
_live_lock = threading.Lock()
_handlers_installed = False


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        # The parent may have died between fork and prctl; then nothing would ever kill us.
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


@dataclass
class ManagedProcess:
    """One running binary: its process group, its log file, and how to stop it."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] | None = field(default=None, repr=False)
    _stopped: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def running(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the whole group, then SIGKILL whatever is left after ``grace_s``."""
        if self._stopped:
            return
        self._stopped = True
        with _live_lock:
            _live.pop(self.pid, None)
        _signal_group(self.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            log.warning("process did not stop on SIGTERM, killing", extra={"component": self.name})
        # The leader may be gone while children it forked still hold the group.
        _signal_group(self.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=grace_s)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def start_process(
    name: str,
    argv: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    die_with_parent: bool = True,
) -> ManagedProcess:
    """Start ``argv`` in its own process group with stdout and stderr going to ``log_path``.

    ``die_with_parent=False`` is for the detached supervisor of ``strata cluster up``, which must
    outlive the command that started it.
    """
    _install_exit_handlers()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log_file:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=dict(os.environ if env is None else env),
            start_new_session=True,
            preexec_fn=_die_with_parent(os.getpid()) if die_with_parent else None,
        )
    process = ManagedProcess(
        name=name, popen=popen, log_path=log_path, argv=list(argv), env=None if env is None else dict(env)
    )
    if die_with_parent:
        with _live_lock:
            _live[popen.pid] = process
    log.debug("started", extra={"component": name, "pid": popen.pid})
    return process


def stop_all() -> None:
    """Stop every process still registered, newest first (kwok before the apiserver before etcd)."""
    with _live_lock:
        processes = list(reversed(_live.values()))
    for process in processes:
        process.stop()


def _on_signal(signum: int, frame: FrameType | None) -> None:
    stop_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _install_exit_handlers() -> None:
    global _handlers_installed
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(stop_all)
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGHUP):
        # Respect a handler someone else installed deliberately; replace only the defaults.
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _on_signal)


def wait_until(check: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.25) -> T:
    """Poll ``check`` until it returns something truthy, and return that; TimeoutError naming
    ``what`` otherwise."""
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)
    return value
