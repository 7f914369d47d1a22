"""Processes the demo leaves running after it returns, recorded so ``strata demo down`` stops them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from strata.cluster.cli import pid_alive


class Detached:
    """A pid registry in ``<dir>/pids.json``: name -> pid of a session leader we started."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.registry = directory / "pids.json"

    def _read(self) -> dict[str, int]:
        try:
            data: dict[str, int] = json.loads(self.registry.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return data

    def _write(self, pids: dict[str, int]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.registry.write_text(json.dumps(pids, indent=2, sort_keys=True))

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` in its own session (it outlives the demo), logging to ``logs/<name>.log``."""
        self.stop(name)
        log = self.log(name)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self._write({**self._read(), name: proc.pid})
        return proc

    def log(self, name: str) -> Path:
        return self.directory / "logs" / f"{name}.log"

    def stop(self, name: str, grace_s: float = 15.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``grace_s``."""
        pids = self._read()
        pid = pids.pop(name, None)
        if pid is not None and pid_alive(pid):
            _signal(pid, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            _signal(pid, signal.SIGKILL)
        self._write(pids)

    def stop_all(self) -> None:
        for name in reversed(list(self._read())):
            self.stop(name)


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
