"""A real ``strata router serve`` process on a loopback port, for tests that send it traffic."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.worker.worker_proc import free_port, wait_ok

READY_WITHIN_S = 60


@dataclass
class RouterProcess:
    base_url: str
    port: int
    config_path: Path
    log_path: Path
    proc: subprocess.Popen[bytes] = field(init=False)

    def metrics(self) -> dict[str, float]:
        """The router's own series, ``name{labels}`` -> value."""
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("strata_router_") and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out

    def start(self) -> None:
        with self.log_path.open("ab") as sink:
            command = [sys.executable, "-m", "strata", "router", "serve", "--config", str(self.config_path)]
            self.proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
        wait_healthy(self)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


def wait_healthy(router: RouterProcess) -> None:
    wait_ok(router.base_url + "/health", router.proc, router.log_path, READY_WITHIN_S)


def router_config(workers: list[str], **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "model": {"name": "tiny", "max_context_tokens": 512, "vocab_size": 320},
        "block_size": 16,
        "host": "127.0.0.1",
        "workers": {"static": workers, "kv_events_port": None},
    }
    for key, value in overrides.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) and key in config else value
    return config


@contextmanager
def running_router(workdir: Path, config: dict[str, Any]) -> Iterator[RouterProcess]:
    port = free_port()
    config = {**config, "port": port}
    config_path = workdir / f"router-{port}.yaml"
    config_path.write_text(yaml.safe_dump(json.loads(json.dumps(config))))
    router = RouterProcess(f"http://127.0.0.1:{port}", port, config_path, workdir / f"router-{port}.log")
    router.start()
    try:
        yield router
    finally:
        router.stop()
