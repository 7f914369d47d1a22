"""A real Prometheus for the tests and the demo, configured from the chart's own monitors.

``start_prometheus(directory, cluster)`` renders the chart's ServiceMonitor and PodMonitors
(``helm template`` with the monitoring API declared), turns them into scrape jobs
(``monitors.scrape_configs``: kubernetes_sd against the test control plane, loopback targets
only), loads the generated rules file, and runs ``prometheus`` on a free 127.0.0.1 port as the
ServiceAccount ``strata-system/prometheus`` (read-only on pods and services). The binaries come
from ``make prometheus`` (tools/prometheus/install.sh: Prometheus 3.10.0 from the Go module
proxy, with kubernetes_sd)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from strata.cluster.cluster import Cluster
from strata.cluster.processes import ManagedProcess, start_process
from strata.observe.monitors import Discovery, scrape_configs
from strata.observe.rules import RULES_FILE

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "charts" / "strata"
MONITORING_API = "monitoring.coreos.com/v1"
NAMESPACE = "strata-system"
SERVICE_ACCOUNT = "prometheus"
START_TIMEOUT_S = 300.0  # a bound, not a wait: ready returns at once; a loaded machine is slow
JsonDict = dict[str, Any]

# What Prometheus' kubernetes_sd needs to read, and nothing more.
RBAC: list[JsonDict] = [
    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
    {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE},
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "strata-test-prometheus"},
        "rules": [{"apiGroups": [""], "resources": ["pods", "services"], "verbs": ["get", "list", "watch"]}],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "strata-test-prometheus"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "strata-test-prometheus",
        },
        "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}],
    },
]


class PrometheusError(RuntimeError):
    """Prometheus is missing, did not start, or refused a query; the message says which."""


def find_binary(name: str) -> Path:
    """``$STRATA_PROMETHEUS_DIR/<name>``, else ``bin/<name>`` (``make prometheus``). Not the PATH:
    a distribution's Prometheus may lack kubernetes_sd (Debian's does)."""
    directory = Path(os.environ.get("STRATA_PROMETHEUS_DIR") or REPO_ROOT / "bin")
    found = directory / name
    if not found.is_file():
        raise PrometheusError(f"{found} not found: run `make prometheus` (tools/prometheus/install.sh)")
    return found


def chart_monitors(cluster: Cluster, release: str = "strata", namespace: str = NAMESPACE) -> list[JsonDict]:
    """The chart's monitors and the Services they select, as `helm template` renders them for
    this cluster's Kubernetes version with the Prometheus Operator's API declared."""
    version = cluster.kubectl_json("version", "-o", "json")["serverVersion"]["gitVersion"]
    argv = [str(cluster.bin_dir / "helm"), "template", release, str(CHART), "-n", namespace]
    argv += ["--kube-version", version]
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):  # as the chart checks for them
        argv += ["--api-versions", f"{MONITORING_API}/{kind}"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    kinds = {"ServiceMonitor", "PodMonitor", "Service"}
    return [d for d in yaml.safe_load_all(out) if d and d.get("kind") in kinds]


def config(jobs: list[JsonDict], rules: Path, interval: str) -> JsonDict:
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(rules)],
        "scrape_configs": jobs,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Prometheus:
    """A running Prometheus; ``url`` is its UI and HTTP API."""

    url: str
    directory: Path
    process: ManagedProcess

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:
            raise PrometheusError(f"{path} {params}: HTTP {exc.code}: {exc.read().decode()[:500]}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[JsonDict]:
        """Instant vector (or scalar) result of ``expr`` now."""
        data = self.api("query", query=expr)
        result: list[JsonDict] = data["result"] if data["resultType"] == "vector" else [data]
        return result

    def targets(self) -> JsonDict:
        targets: JsonDict = self.api("targets")
        return targets

    def stop(self) -> None:
        self.process.stop()


def _discovery(cluster: Cluster, directory: Path) -> Discovery:
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": RBAC}))
    token = cluster.kubectl(
        "create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE, "--duration=24h"
    ).stdout.strip()
    token_file = directory / "token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    return Discovery(cluster.api_url, str(cluster.ca_cert), str(token_file))


def prepare(
    directory: Path,
    cluster: Cluster,
    interval: str = "5s",
    port: int | None = None,
    extra_jobs: Sequence[JsonDict] = (),
) -> tuple[list[str], str]:
    """Write the configuration; the command line that runs Prometheus on it, and its URL."""
    directory.mkdir(parents=True, exist_ok=True)
    jobs = [*scrape_configs(chart_monitors(cluster), _discovery(cluster, directory), interval), *extra_jobs]
    config_file = directory / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config(jobs, REPO_ROOT / RULES_FILE, interval), sort_keys=False))
    address = f"127.0.0.1:{port or free_port()}"
    argv = [
        str(find_binary("prometheus")),
        f"--config.file={config_file}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address={address}",
        "--storage.tsdb.retention.time=1d",
    ]
    return argv, f"http://{address}"


def start_prometheus(
    directory: Path, cluster: Cluster, interval: str = "5s", port: int | None = None
) -> Prometheus:
    """Prometheus on 127.0.0.1, scraping what the chart's monitors select; stop() it."""
    argv, url = prepare(directory, cluster, interval, port)
    # Dies with this process even when it is killed (no fixture teardown runs on SIGTERM/SIGKILL).
    process = start_process("prometheus", argv, directory / "prometheus.log")
    server = Prometheus(url, directory, process)
    try:
        wait_ready(url, START_TIMEOUT_S, process.popen)
    except PrometheusError as exc:
        server.stop()
        log_tail = (directory / "prometheus.log").read_text()[-3000:]
        raise PrometheusError(f"{exc}:\n{log_tail}") from None
    return server


def wait_ready(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Until ``url``/-/ready answers; PrometheusError (with the log) if it exits or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise PrometheusError(f"prometheus exited with {proc.returncode} (see its log)")
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise PrometheusError(f"prometheus at {url} not ready after {timeout_s:.0f} s")
