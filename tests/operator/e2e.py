"""End-to-end helpers: install the chart's RBAC, run the operator as its ServiceAccount, wait.

The operator runs as a subprocess (``strata operator``) with a TokenRequest kubeconfig of the
chart's ServiceAccount, so every test exercises exactly the chart's RBAC, never cluster-admin.
KWOK nodes have no storage provisioner, so the local-NVMe tier uses the documented hostPath
fallback (``STRATA_NVME_VOLUME=hostPath``); claims would stay Pending and block scheduling."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from strata.cluster.cluster import Cluster

ROOT = Path(__file__).resolve().parents[2]
RELEASE_NAMESPACE = "strata-system"
SERVICE_ACCOUNT = "strata"
T = TypeVar("T")


def install_operator_rbac(cluster: Cluster) -> Path:
    """CRDs, the chart minus the operator Deployment, and a kubeconfig of its ServiceAccount."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(ROOT / "crds"))
    rendered = subprocess.run(
        [
            str(cluster.bin_dir / "helm"),
            "template",
            "--include-crds",
            "strata",
            str(ROOT / "charts" / "strata"),
            "-n",
            RELEASE_NAMESPACE,
            "--set",
            "operator.replicas=2",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    crds = [d for d in docs if d["kind"] == "CustomResourceDefinition"]
    rest = [d for d in docs if d["kind"] not in ("CustomResourceDefinition", "Deployment", "Service")]
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=_list(crds))
    for crd in crds:
        cluster.kubectl(
            "wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}", "--timeout=60s"
        )
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": RELEASE_NAMESPACE}}
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=_list([ns, *rest]))
    return cluster.service_account_kubeconfig(RELEASE_NAMESPACE, SERVICE_ACCOUNT)


def _list(items: list[dict[str, Any]]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class OperatorProcess:
    kubeconfig: Path
    log: Path
    args: list[str] = field(default_factory=lambda: ["--standalone"])
    peering_lifetime_s: int = 60
    metrics_port: int = field(default_factory=free_port)
    liveness_port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)  # extra STRATA_* settings
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        env = {
            **os.environ,
            "STRATA_NVME_VOLUME": "hostPath",
            "STRATA_NVME_HOST_PATH": "/var/lib/strata-e2e/nvme",
            "STRATA_PEERING_LIFETIME_S": str(self.peering_lifetime_s),
            # KWOK's pod IPs are fake addresses in 10.244.0.0/16: never let the autoscaler send
            # traffic there. Loopback port 9 refuses at once; tests that scrape override this.
            "STRATA_SCRAPE_ADDRESS": "127.0.0.1:9",
            **self.env,
        }
        argv = [
            sys.executable,
            "-m",
            "strata",
            "operator",
            f"--kubeconfig={self.kubeconfig}",
            f"--metrics-port={self.metrics_port}",
            f"--liveness=http://127.0.0.1:{self.liveness_port}/healthz",
            *self.args,
        ]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        wait_for(self._live, 60, what=f"operator liveness (log {self.log})")
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
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


@contextlib.contextmanager
def operator_running(cluster: Cluster, log: Path, **options: Any) -> Iterator[OperatorProcess]:
    """The chart's RBAC installed and the operator running as its ServiceAccount, then stopped."""
    process = OperatorProcess(install_operator_rbac(cluster), log, **options).start()
    try:
        yield process
    finally:
        process.stop()


def wait_for(
    check: Callable[[], T | None], timeout_s: float, what: str = "condition", interval_s: float = 0.5
) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


def inference_service(name: str, tier: str = "standard", **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "strata.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "tier": tier,
            "model": {"name": "tiny", "source": {"builtin": "tiny"}},
            "resources": {"gpus": 1, "gpuProduct": "NVIDIA-H100-80GB-HBM3", "cpu": "1", "memory": "4Gi"},
            "cache": {"dram": "1Gi", "nvme": "10Gi"},
            **spec,
        },
    }
    return body


def get(cluster: Cluster, kind: str, name: str, namespace: str | None = None) -> Any:
    """The object as JSON, or None when it does not exist."""
    args = ["get", kind, name, "--ignore-not-found", "-o", "json"] + (["-n", namespace] if namespace else [])
    out = cluster.kubectl(*args).stdout.strip()
    return json.loads(out) if out else None


def items(cluster: Cluster, kind: str, namespace: str, selector: str = "") -> list[dict[str, Any]]:
    args = ["get", kind, "-n", namespace, "-o", "json"] + ([f"-l={selector}"] if selector else [])
    result: list[dict[str, Any]] = cluster.kubectl_json(*args)["items"]
    return result


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions", []):
        if cond["type"] == type_:
            return dict(cond)
    return {}


def wait_ready(cluster: Cluster, namespace: str, name: str, timeout_s: float = 90) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        obj = get(cluster, "inferenceservice", name, namespace)
        return obj if condition(obj, "Ready").get("status") == "True" else None

    return wait_for(ready, timeout_s, what=f"InferenceService {namespace}/{name} Ready")


def running_pods(cluster: Cluster, namespace: str, service: str) -> list[dict[str, Any]]:
    pods = items(cluster, "pods", namespace, f"app.kubernetes.io/instance={service}")
    return [
        p
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


def events(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    listed = items(cluster, "events", namespace)
    return [
        e
        for e in listed
        if e["involvedObject"].get("name") == name and e["involvedObject"].get("kind") == "InferenceService"
    ]
