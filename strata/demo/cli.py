"""``strata demo [up|down]``: run the whole story, leave it running, stop it again."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from strata import stack
from strata.cluster import binaries
from strata.cluster import cli as cluster_cli
from strata.cluster.cluster import Cluster
from strata.demo import dataplane, observe, platform, scaling
from strata.demo.detached import Detached
from strata.operator.resolve import SERVER_PORT
from strata.worker.config import WorkerConfig

DEFAULT_DIR = binaries.REPO_ROOT / ".demo"
PROMPT_TOKENS = 4000
SCRAPED_WITHIN_S = 120.0  # a bound: it ends as soon as the status shows an interval with requests


def step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def up(directory: Path) -> int:
    detached = Detached(directory)
    started = time.monotonic()
    step(
        "1/7 control plane: etcd, kube-apiserver (RBAC), controller-manager, scheduler, 4 KWOK GPU nodes,"
        " a local node whose pods run for real"
    )
    cluster = platform.start_cluster(directory / "cluster")
    step("2/7 helm install charts/strata: CRDs, admission policy, RBAC, ServiceTiers premium/standard/batch")
    sa_kubeconfig = stack.install_chart(cluster)
    step("3/7 the operator, as the chart's ServiceAccount (least-privilege RBAC)")
    operator_port = platform.start_operator(detached, sa_kubeconfig)
    step(f"4/7 a tenant applies an InferenceService ({platform.TENANT}/{platform.SERVICE}, tier premium)")
    platform.apply_service(cluster)
    platform.wait_ready(cluster)
    print(platform.show(cluster))
    step("5/7 the data plane the operator rendered: torch worker + KV-tier sidecar, from its ConfigMap,")
    print("    run here at the pod's IP (the KWOK pod runs nothing)")
    pod_ip = platform.pod_ip(cluster)
    config = dataplane.localize(platform.rendered_worker_config(cluster), directory, pod_ip, SERVER_PORT)
    service = cluster.kubectl_json("get", "inferenceservice", platform.SERVICE, "-n", platform.TENANT)
    source = _source_uri(service["spec"]["model"]["source"])
    for name in ("worker", "kvtier"):  # an earlier run's, before their state is wiped
        detached.stop(name)
    config_path = dataplane.prepare(config, source, directory)
    print(f"worker.yaml: {config_path} (cache namespace {config.cache_namespace!r})")
    dataplane.start_sidecar(detached, config_path)
    api = dataplane.start_worker(detached, config_path, config)
    service = (platform.TENANT, platform.SERVICE, "premium")
    addresses = (f"{pod_ip}:{SERVER_PORT}", f"127.0.0.1:{config.kvtier.metrics_port}")
    prometheus = observe.start_prometheus(detached, cluster, directory, operator_port, service, addresses)
    print(f"Prometheus {prometheus} (the chart's monitors, the rules; HTTP API: {prometheus}/api/v1/query)")
    step(f"6/7 one {PROMPT_TOKENS}-token prompt through the memory hierarchy")
    rows, api = _walk_the_hierarchy(detached, config_path, config, api)
    _print_table(rows)
    _traffic_until_scraped(cluster, api, config.model.name)
    print("\nafter a few seconds of repeated requests, the signals the operator scraped into its status:")
    print(platform.signals(cluster))
    print(cluster.kubectl("get", "inferenceservice", platform.SERVICE, "-n", platform.TENANT).stdout)
    step("7/7 the scaling act: a slice of the conversation trace through each service's router")
    scaling.run(cluster)
    print(_usage(directory, cluster.kubeconfig, api, prometheus, time.monotonic() - started))
    return 0


def _walk_the_hierarchy(
    detached: Detached, config_path: Path, config: WorkerConfig, api: str
) -> tuple[list[tuple[str, float, dict[str, float]]], str]:
    prompt = dataplane.long_prompt(PROMPT_TOKENS)
    model = config.model.name
    rows: list[tuple[str, float, dict[str, float]]] = []

    def measure(label: str, api: str) -> None:
        before = dataplane.hit_tokens(api)
        ttft = dataplane.time_to_first_token(api, model, prompt)
        after = dataplane.hit_tokens(api)
        rows.append((label, ttft, {t: after[t] - before[t] for t in dataplane.TIERS}))
        print(f"  {label:<44} TTFT {ttft:7.3f} s", flush=True)

    measure("cold (nothing cached)", api)
    measure("again: prefix in HBM", api)
    detached.stop("worker")
    api = dataplane.start_worker(detached, config_path, config)
    measure("worker restarted: HBM empty, prefix in DRAM", api)
    detached.stop("worker")
    detached.stop("kvtier")
    dataplane.start_sidecar(detached, config_path)
    api = dataplane.start_worker(detached, config_path, config)
    measure("worker and sidecar restarted: prefix on NVMe", api)
    return rows, api


def _source_uri(source: dict[str, object]) -> str:
    if "builtin" in source:
        return f"builtin://{source['builtin']}"
    if "uri" in source:
        return str(source["uri"])
    raise ValueError("spec.model.source: the demo serves builtin or uri sources, not a PVC")


def _traffic_until_scraped(cluster: Cluster, api: str, model: str) -> None:
    """Repeated requests until the operator has written an interval that had some into the
    service's status (TTFT and hit ratio). A fixed few intervals were not enough: the interval
    that spans the walk's restarts (counters reset) may be the last one written."""
    prompt = dataplane.long_prompt(PROMPT_TOKENS)
    deadline = time.monotonic() + SCRAPED_WITHIN_S
    while time.monotonic() < deadline:
        for _ in range(3):
            dataplane.time_to_first_token(api, model, prompt)
        signals = platform.status_signals(cluster)
        if signals.get("ttftP95Ms") is not None and signals.get("prefixHitRatio"):
            return
    print(f"(the operator wrote no interval with requests within {SCRAPED_WITHIN_S:.0f} s)")


def _print_table(rows: list[tuple[str, float, dict[str, float]]]) -> None:
    cold = rows[0][1]
    print(f"\n{'request':<46}{'TTFT s':>9}{'vs cold':>9}   prompt tokens served from")
    for label, ttft, hits in rows:
        served = ", ".join(f"{t} {int(n)}" for t, n in hits.items() if n) or "none (recomputed)"
        print(f"{label:<46}{ttft:>9.3f}{cold / ttft:>8.1f}x   {served}")


def _usage(directory: Path, kubeconfig: Path, api: str, prometheus: str, elapsed_s: float) -> str:
    return f"""
Strata is up ({elapsed_s:.0f} s). Still running: the control plane, the operator, the worker, the sidecar,
Prometheus, and the scaling act's two services, idle (kubectl get infsvc,pods -n {scaling.NAMESPACE}).
  export KUBECONFIG={kubeconfig}
  kubectl get inferenceservices -A          # or: kubectl get strata -A
  kubectl describe inferenceservice {platform.SERVICE} -n {platform.TENANT}
  curl -s {api}/v1/completions -H 'content-type: application/json' \\
       -d '{{"model": "demo-small", "prompt": "Hello", "max_tokens": 16}}'
  curl -s {api}/metrics | grep strata_worker_prefix
Prometheus at {prometheus} (HTTP API; a Go module build has no web UI), with Strata's rules:
  curl -s '{prometheus}/api/v1/query?query=strata:kv_cache_usage:avg'
  curl -s '{prometheus}/api/v1/query?query=strata_service_bottleneck==1'
logs: {directory / "logs"} and {directory / "cluster" / "logs"}
stop everything: strata demo down
"""


def down(directory: Path) -> int:
    Detached(directory).stop_all()
    shutil.rmtree(dataplane.shm_dir(directory), ignore_errors=True)  # memory, not disk: give it back
    # The walk-through's NVMe tier preallocates its file (up to MAX_NVME_BYTES); the next run wipes it anyway.
    shutil.rmtree(dataplane.nvme_dir(directory), ignore_errors=True)
    return cluster_cli.cmd_down(directory / "cluster") if (directory / "cluster").exists() else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="strata demo", description=__doc__)
    parser.add_argument("action", nargs="?", choices=["up", "down"], default="up")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state directory (default .demo)")
    args = parser.parse_args(argv)
    directory = args.dir.resolve()
    if args.action == "down":
        return down(directory)
    try:
        return up(directory)
    except KeyboardInterrupt:
        print("\nstrata demo: interrupted; stopping everything it started", file=sys.stderr)
        down(directory)
        return 130
    except Exception as exc:  # the demo is for people: say what failed and where to look
        print(
            f"\nstrata demo: {exc}\nlogs: {directory / 'logs'}; stop with: strata demo down", file=sys.stderr
        )
        return 1
