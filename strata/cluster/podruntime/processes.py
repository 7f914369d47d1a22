"""Container processes: start a shim (``launch.py``) for a container, wait for it, signal it.

The shim's pid is recorded in ``<pod dir>/containers/<name>.json`` with the container's process
(its child), so tests and people can find the process a container runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from strata.cluster.podruntime import launch
from strata.cluster.podruntime.mounts import Mount

LAUNCHER = Path(launch.__file__)
# A bound on the shim's making the container (namespaces, mounts) and its exec, or its exit after
# a failed exec: normally milliseconds.
START_HANDSHAKE_S = 60.0


@dataclass
class Shim:
    name: str
    process: asyncio.subprocess.Process
    error_file: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def child_pid(self) -> int | None:
        """The container's own process (PID 1 in its namespace), as the host numbers it."""
        try:
            children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def signal(self, sig: signal.Signals) -> None:
        """SIGKILL kills the shim (and so the container); other signals are forwarded to it."""
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(sig)

    async def wait(self) -> tuple[int, str]:
        """(exit code, the start error when the container could not be made)."""
        code = await self.process.wait()
        code = 128 - code if code < 0 else code
        try:
            message = self.error_file.read_text()
        except OSError:
            message = ""
        return code, message


def root_dir(state_dir: Path, name: str) -> Path:
    """Where the container's root is mounted (inside its own mount namespace; empty on the host)."""
    return state_dir / f"{name}.root"


def _spec_file(directory: Path, stem: str, spec: dict[str, object]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stem}.launch.json"
    path.write_text(json.dumps(spec))
    path.chmod(0o600)  # it holds the container's environment
    return path


async def _spawn(
    spec_path: Path, log: Path | None, pass_fds: tuple[int, ...] = ()
) -> asyncio.subprocess.Process:
    argv = [sys.executable, "-I", "-S", str(LAUNCHER), str(spec_path)]
    out = log.open("ab") if log is not None else None
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out if out is not None else asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.STDOUT if out is not None else asyncio.subprocess.DEVNULL,
            start_new_session=True,
            pass_fds=pass_fds,
        )
    finally:
        if out is not None:
            out.close()


async def start(
    name: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    mounts: Sequence[Mount],
    *,
    state_dir: Path,
    log: Path,
    hostname: str,
    cwd: str = "/",
    read_only_root: bool = False,
) -> Shim:
    """Start container ``name``: its shim makes the namespaces and mounts, then runs ``argv``.
    Returns once ``argv`` runs or could not be started; then the shim has already exited, so a
    container whose command is missing is never reported running, as with a kubelet."""
    log.parent.mkdir(parents=True, exist_ok=True)
    error_file = state_dir / f"{name}.error"
    error_file.unlink(missing_ok=True)
    reading, writing = os.pipe()
    spec = {
        "mode": "run",
        "parent": os.getpid(),
        "argv": list(argv),
        "env": dict(env),
        "cwd": cwd,
        "mounts": [{"source": m.source, "target": m.target, "read_only": m.read_only} for m in mounts],
        "hostname": hostname,
        "error_file": str(error_file),
        "root": str(root_dir(state_dir, name)),
        "read_only_root": read_only_root,
        "started_fd": writing,
    }
    try:
        process = await _spawn(_spec_file(state_dir, name, spec), log, (writing,))
    finally:
        os.close(writing)
    shim = Shim(name, process, error_file)
    record = {"shim": shim.pid, "log": str(log)}
    (state_dir / f"{name}.json").write_text(json.dumps(record))
    await _until_started(reading, shim)
    return shim


async def _until_started(reading: int, shim: Shim) -> None:
    """Until the exec closed the pipe's last write end (or the shim or its child died); when the
    start failed, until the shim has exited, so its exit is known before anything is reported."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(reading, "rb")
    )
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reader.read(), START_HANDSHAKE_S)
    finally:
        transport.close()
    if shim.error_file.exists() and shim.error_file.stat().st_size:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(shim.process.wait(), START_HANDSHAKE_S)


async def exec_in(
    shim: Shim, argv: Sequence[str], env: Mapping[str, str], timeout_s: float, state_dir: Path
) -> int:
    """Run ``argv`` inside a running container (exec probes and hooks); its exit code, or 1 on
    a timeout (the command is killed)."""
    spec = {
        "mode": "exec",
        "parent": os.getpid(),
        "join": shim.pid,
        "root": str(root_dir(state_dir, shim.name)),
        "argv": list(argv),
        "env": dict(env),
    }
    spec_path = _spec_file(state_dir, f"{shim.name}.exec-{uuid.uuid4().hex[:8]}", spec)
    process = await _spawn(spec_path, None)
    try:
        return await asyncio.wait_for(process.wait(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        return 1
    finally:
        spec_path.unlink(missing_ok=True)
