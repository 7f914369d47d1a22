"""Data-plane processes on loopback ports, as the operator would run them: a real ``strata worker
serve`` and a real ``strata router serve``, started, waited on (bounded) and stopped (reaped).

For the tests that talk to them with the clients users use, and for the routing benchmark's
real-process half, so neither imports from tests/.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from strata.stack.wait import free_port

READY_WITHIN_S = 300  # a generous bound: a cold, loaded machine imports torch slowly
STOP_WITHIN_S = 30


@dataclass(frozen=True)
class WorkerProcess:
    base_url: str
    log_path: Path
    proc: subprocess.Popen[bytes]

    def log_lines(self) -> list[str]:
        return self.log_path.read_text().splitlines()


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


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it does not exit in time; always reaped."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_WITHIN_S)


def _spawn(argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "strata", *argv], stdout=sink, stderr=subprocess.STDOUT, env=env
        )


@contextmanager
def running_worker(
    model_dir: Path,
    workdir: Path,
    name: str = "tiny",
    env: dict[str, str] | None = None,
    max_context_tokens: int = 512,
    **engine: object,
) -> Iterator[WorkerProcess]:
    """Serve ``model_dir`` (one torch thread) until the block ends; then stop and reap it."""
    with running_workers([workdir], model_dir, name, env, max_context_tokens, **engine) as (worker,):
        yield worker


@contextmanager
def running_workers(
    workdirs: list[Path],
    model_dir: Path,
    name: str = "tiny",
    env: dict[str, str] | None = None,
    max_context_tokens: int = 512,
    **engine: object,
) -> Iterator[list[WorkerProcess]]:
    """One worker per directory, started together (model loading overlaps), all stopped after."""
    workers: list[WorkerProcess] = []
    try:
        for workdir in workdirs:
            workers.append(_start_worker(workdir, model_dir, name, env, max_context_tokens, engine))
        for worker in workers:
            wait_ok(worker.base_url + "/ready", worker.proc, worker.log_path, READY_WITHIN_S)
        yield workers
    finally:
        for worker in workers:
            stop(worker.proc)


def _start_worker(
    workdir: Path,
    model_dir: Path,
    name: str,
    env: dict[str, str] | None,
    max_context_tokens: int,
    engine: dict[str, object],
) -> WorkerProcess:
    port = free_port()
    config = {
        "model": {"name": name, "path": str(model_dir), "max_context_tokens": max_context_tokens},
        "engine": {"device": "cpu", "num_gpu_blocks": 128, "cpu_threads": 1, **engine},
        "server": {"host": "127.0.0.1", "port": port},
    }
    config_path = workdir / "worker.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = workdir / "worker.log"
    proc = _spawn(["worker", "serve", "--config", str(config_path)], log_path, env)
    return WorkerProcess(f"http://127.0.0.1:{port}", log_path, proc)


@dataclass
class RouterProcess:
    base_url: str
    config_path: Path
    log_path: Path
    env: dict[str, str] | None = None  # the whole environment (None: this process's)
    proc: subprocess.Popen[bytes] = field(init=False)

    def start(self) -> None:
        self.proc = _spawn(["router", "serve", "--config", str(self.config_path)], self.log_path, self.env)
        wait_ok(self.base_url + "/health", self.proc, self.log_path, READY_WITHIN_S)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=STOP_WITHIN_S)

    def metrics(self) -> dict[str, float]:
        """The router's own series, ``name{labels}`` -> value."""
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        return {
            name: float(value)
            for line in text.splitlines()
            if line.startswith("strata_router_")
            for name, _, value in [line.rpartition(" ")]
        }


def router_config(workers: list[str], name: str = "tiny", **overrides: Any) -> dict[str, Any]:
    """A router in front of fixed worker URLs serving the ``tiny``/``small`` test models."""
    config: dict[str, Any] = {
        "model": {"name": name, "max_context_tokens": 512, "vocab_size": 320},
        "host": "127.0.0.1",
        "workers": {"static": workers, "kv_events_port": None},
    }
    for key, value in overrides.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) and key in config else value
    return config


@contextmanager
def running_router(
    workdir: Path, config: dict[str, Any], env: dict[str, str] | None = None
) -> Iterator[RouterProcess]:
    port = free_port()
    config_path = workdir / f"router-{port}.yaml"
    config_path.write_text(yaml.safe_dump(json.loads(json.dumps({**config, "port": port}))))
    router = RouterProcess(f"http://127.0.0.1:{port}", config_path, workdir / f"router-{port}.log", env)
    router.start()
    try:
        yield router
    finally:
        stop(router.proc)
