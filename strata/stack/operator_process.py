"""The operator as a process on this machine, as the chart's ServiceAccount.

``strata operator`` runs with a TokenRequest kubeconfig of the chart's ServiceAccount, so what it
may do is exactly what the chart grants. KWOK nodes have no storage provisioner, so the local-NVMe
tier uses the documented hostPath fallback; claims would stay Pending and block scheduling."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from strata.cluster.cluster import Cluster
from strata.stack.chart import install_chart
from strata.stack.wait import free_port, wait_for

NVME_HOST_PATH = "/var/lib/strata/nvme"
START_TIMEOUT_S = 180.0  # imports and the first lists, on a loaded machine
STOP_GRACE_S = 30.0


def operator_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus the settings a KWOK cluster needs, then ``extra``."""
    return {
        **os.environ,
        "STRATA_NVME_VOLUME": "hostPath",
        "STRATA_NVME_HOST_PATH": NVME_HOST_PATH,
        # Loopback, not 0.0.0.0: pods share this host's ports here, and a Service's ClusterIP:port
        # (the pod runtime's proxy) must not collide with an operator's wildcard bind.
        "STRATA_METRICS_HOST": "127.0.0.1",
        **(extra or {}),
    }


def operator_argv(kubeconfig: Path, metrics_port: int, liveness_port: int, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "strata",
        "operator",
        f"--kubeconfig={kubeconfig}",
        f"--metrics-port={metrics_port}",
        f"--liveness=http://127.0.0.1:{liveness_port}/healthz",
        *args,
    ]


@dataclass
class OperatorProcess:
    """A child process of the caller, stopped by ``stop`` (or ``kill``, the worst case)."""

    kubeconfig: Path
    log: Path
    args: list[str] = field(default_factory=lambda: ["--standalone"])
    peering_lifetime_s: int = 60
    metrics_port: int = field(default_factory=free_port)
    liveness_port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)  # extra STRATA_* settings
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        env = operator_env({"STRATA_PEERING_LIFETIME_S": str(self.peering_lifetime_s), **self.env})
        argv = operator_argv(self.kubeconfig, self.metrics_port, self.liveness_port, *self.args)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            wait_for(self._live, START_TIMEOUT_S, what=f"operator liveness (log {self.log})")
        except BaseException:
            self.stop()  # a start that failed leaves no process behind
            raise
        return self

    def _live(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(
                f"operator exited with {self.proc.returncode}; log:\n{self.log.read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def metric(self, name: str) -> float:
        """Sum of every sample of ``name`` on the operator's metrics endpoint."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))

    def kill(self) -> None:
        """SIGKILL: no cleanup, no goodbye to the peers - the worst case."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.kill()


@contextlib.contextmanager
def operator_running(cluster: Cluster, log: Path, **options: Any) -> Iterator[OperatorProcess]:
    """The chart installed and the operator running as its ServiceAccount, then stopped."""
    process = OperatorProcess(install_chart(cluster), log, **options).start()
    try:
        yield process
    finally:
        process.stop()
