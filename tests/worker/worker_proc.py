"""A real ``strata worker serve`` process on a loopback port, as the operator runs it, for tests
that talk to it with the clients users use (the official ``openai`` client)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

READY_WITHIN_S = 120  # a generous bound: a cold, loaded machine imports torch slowly


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class WorkerProcess:
    base_url: str
    log_path: Path
    proc: subprocess.Popen[bytes]

    def log_lines(self) -> list[str]:
        return self.log_path.read_text().splitlines()


def _wait_ready(worker: WorkerProcess) -> None:
    wait_ok(worker.base_url + "/ready", worker.proc, worker.log_path, READY_WITHIN_S)


def wait_ok(url: str, proc: subprocess.Popen[bytes], log_path: Path, within_s: float) -> None:
    """Until ``url`` answers 200; fails with the process's log if it exits or time runs out."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args!r} exited {proc.returncode}:\n{log_path.read_text()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{url} not answering 200 after {within_s} s:\n{log_path.read_text()}")
        time.sleep(0.2)


@contextmanager
def running_worker(
    model_dir: Path, workdir: Path, name: str = "tiny", env: dict[str, str] | None = None, **engine: object
) -> Iterator[WorkerProcess]:
    """Serve ``model_dir`` (one torch thread) until the block ends; then SIGTERM and reap it."""
    port = free_port()
    config = {
        "model": {"name": name, "path": str(model_dir), "max_context_tokens": 512},
        "engine": {"device": "cpu", "num_gpu_blocks": 128, "cpu_threads": 1, **engine},
        "server": {"host": "127.0.0.1", "port": port},
    }
    config_path = workdir / "worker.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = workdir / "worker.log"
    with log_path.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "strata", "worker", "serve", "--config", str(config_path)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
        )
    worker = WorkerProcess(f"http://127.0.0.1:{port}", log_path, proc)
    try:
        _wait_ready(worker)
        yield worker
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
