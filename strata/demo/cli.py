"""``strata demo [up|down]``: run the whole story, leave it running, stop it again."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from strata import stack
from strata.cluster import binaries
from strata.cluster import cli as cluster_cli
from strata.cluster.cluster import Cluster
from strata.demo import dataplane, observe, platform, scaling, walk
from strata.demo.detached import Detached

DEFAULT_DIR = binaries.REPO_ROOT / ".demo"
PROMPT_TOKENS = 4000
SCRAPED_WITHIN_S = 120.0  # a bound: it ends as soon as the status shows an interval with requests


def step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def up(directory: Path) -> int:
    if directory.exists():  # an earlier run's: its warm pod and its NVMe files would spoil "cold"
        print(f"strata demo: stopping what an earlier run left in {directory} first", flush=True)
        down(directory)
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
    operator_port = platform.start_operator(detached, sa_kubeconfig, platform.nvme_dir(directory))
    step(f"4/7 a tenant applies an InferenceService ({platform.TENANT}/{platform.SERVICE}, tier premium)")
    platform.apply_service(cluster)
    platform.wait_ready(cluster)
    print(platform.show(cluster))
    step("5/7 the data plane the operator rendered, running for real: the pod runtime started its")
    print("    model fetch, its KV-tier sidecar (a native sidecar) and its torch worker from the pod spec")
    pod = platform.walk_pod(cluster)
    print(platform.show_pod(cluster, pod))
    prometheus = observe.start_prometheus(detached, cluster, directory, operator_port)
    print(f"Prometheus {prometheus} (the chart's monitors, the rules; HTTP API: {prometheus}/api/v1/query)")
    step(f"6/7 one {PROMPT_TOKENS}-token prompt through the memory hierarchy, at {pod.name} ({pod.ip})")
    rows, pod = walk.walk(
        cluster,
        pod,
        PROMPT_TOKENS,
        lambda name: platform.walk_pod(cluster, name),
        lambda replicas: platform.scale(cluster, replicas),
    )
    print("\n" + "\n".join(walk.table(rows)))
    _traffic_until_scraped(cluster, pod)
    print("\nafter a few seconds of repeated requests, the signals the operator scraped into its status:")
    print(platform.signals(cluster))
    print(cluster.kubectl("get", "inferenceservice", platform.SERVICE, "-n", platform.TENANT).stdout)
    step("7/7 the scaling act: a slice of the conversation trace through each service's router")
    scaling.run(cluster)
    print(_usage(directory, cluster.kubeconfig, pod, prometheus, time.monotonic() - started))
    return 0


def _traffic_until_scraped(cluster: Cluster, pod: walk.WalkPod) -> None:
    """Repeated requests until the operator has written into the service's status (TTFT and hit
    ratio) an interval that holds only these: one that began after they did. The first interval
    written after they started may still hold the walk's last request, or span its restarts."""
    prompt = dataplane.long_prompt(PROMPT_TOKENS)
    # observedAt has whole seconds: a scrape shown at or after the next whole second was after now.
    started = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=1)
    seen: set[datetime] = set()
    deadline = time.monotonic() + SCRAPED_WITHIN_S
    while time.monotonic() < deadline:
        for _ in range(3):
            dataplane.time_to_first_token(pod.api, pod.config.model.name, prompt)
        signals = platform.status_signals(cluster)
        observed = platform.observed_at(signals)
        if observed is not None and observed >= started:
            seen.add(observed)
        # The second scrape written since: its interval began at a scrape after ``started``.
        if len(seen) >= 2 and signals.get("ttftP95Ms") is not None and signals.get("prefixHitRatio"):
            return
    print(f"(the operator wrote no interval of these requests alone within {SCRAPED_WITHIN_S:.0f} s)")


def _usage(directory: Path, kubeconfig: Path, pod: walk.WalkPod, prometheus: str, elapsed_s: float) -> str:
    return f"""
Strata is up ({elapsed_s:.0f} s). Still running: the control plane and its pod runtime, which runs
{pod.namespace}/{pod.name} (worker and sidecar) and the scaling act's two services, idle
(kubectl get infsvc,pods -n {scaling.NAMESPACE}); the operator; Prometheus.
  export KUBECONFIG={kubeconfig}
  kubectl get inferenceservices -A          # or: kubectl get strata -A
  kubectl describe inferenceservice {platform.SERVICE} -n {platform.TENANT}
  kubectl get pod {pod.name} -n {pod.namespace} -o wide     # the walk's replacement pod
  curl -s {pod.api}/v1/completions -H 'content-type: application/json' \\
       -d '{{"model": "{pod.config.model.name}", "prompt": "Hello", "max_tokens": 16}}'
  curl -s {pod.api}/metrics | grep strata_worker_prefix
  curl -s {pod.kv_metrics}/metrics | grep strata_kvtier_blocks
Prometheus at {prometheus} (HTTP API; a Go module build has no web UI), with Strata's rules:
  curl -s '{prometheus}/api/v1/query?query=strata:kv_cache_usage:avg'
  curl -s '{prometheus}/api/v1/query?query=strata_service_bottleneck==1'
logs: {directory / "logs"}, {directory / "cluster" / "logs"} (pods' containers: pods/<namespace>_<pod>_<uid>/)
stop everything: strata demo down
"""


def down(directory: Path) -> int:
    Detached(directory).stop_all()
    code = cluster_cli.cmd_down(directory / "cluster") if (directory / "cluster").exists() else 0
    # The walk-through pod's NVMe volume (a hostPath, as on a node): its tier preallocated its file
    # (gigabytes); its DRAM tier was a tmpfs in the pod runtime's mount namespace, gone with it.
    shutil.rmtree(platform.nvme_dir(directory), ignore_errors=True)
    return code


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
