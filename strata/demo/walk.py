"""The demo's walk through the memory hierarchy, at the premium service's real pod.

One long prompt, five times: cold; again (HBM); after the engine container crashed (SIGKILL to
its process, found through the pod runtime's records) and the runtime restarted it by the pod's
restartPolicy: HBM is gone, the native sidecar kept running, so the prefix comes from DRAM; after
engine and sidecar both crashed: the DRAM tier's memory volume outlives its containers and the
restarted sidecar recovers the blocks from its slot table, so the prefix still comes from DRAM;
then after the pod was deleted and its StatefulSet made a new one: the memory volume went with
the old pod, the prefix comes from NVMe, whose index is on the node's NVMe volume and survives;
last, at a second replica (the service pinned at two for a moment), whose own tiers are empty:
the prefix comes from the service's shared volume, which the first wrote it through to. Each
row counts the prompt tokens each tier served (the worker's own counters)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from strata import stack
from strata.cluster.cluster import Cluster
from strata.cluster.podruntime.status import container_statuses
from strata.cluster.podstate import ready_condition
from strata.common.tiers import TIERS
from strata.demo import dataplane
from strata.worker.config import WorkerConfig

ENGINE, SIDECAR = "engine", "kvtier"
# A bound, not a wait: a restarted engine imports torch and loads its model (a minute or more on
# a loaded two-core machine); the second crash also waits out the runtime's 10 s back-off; a
# replaced pod also waits out the old one's graceful stop.
RESTART_S = 900.0
# Write-through to NVMe runs in the background after the DRAM hit admits the blocks.
COMMITTED_S = 120.0

Row = tuple[str, float, dict[str, float]]


@dataclass(frozen=True)
class WalkPod:
    """The walk-through's pod: where it is, and its rendered worker.yaml (parsed once)."""

    namespace: str
    name: str
    ip: str
    config: WorkerConfig

    @property
    def api(self) -> str:
        return f"http://{self.ip}:{self.config.server.port}"

    @property
    def kv_metrics(self) -> str:
        return f"http://{self.ip}:{self.config.kvtier.metrics_port}"


def restart_counts(pod: Mapping[str, Any]) -> dict[str, int]:
    """Each container's restartCount (main and init containers) as the pod's status says."""
    statuses = container_statuses(pod.get("status") or {})
    return {name: int(s.get("restartCount", 0)) for name, s in statuses.items()}


def restarted_and_ready(pod: Mapping[str, Any], before: Mapping[str, int]) -> bool:
    """Every container of ``before`` restarted since (restartCount went up) and is ready again,
    and the pod is Ready: the runtime sets a container unready when it starts it, so its ready
    flag after a higher restartCount is the new process's readiness probe."""
    status = pod.get("status") or {}
    by_name = container_statuses(status)
    for name, count in before.items():
        state = by_name.get(name) or {}
        if int(state.get("restartCount", 0)) <= count or not state.get("ready"):
            return False
    return ready_condition(status)


def replaced_and_ready(pods: Sequence[Mapping[str, Any]], old_uid: str) -> bool:
    """A pod of the listed name is not the deleted one (another UID) and is Ready: the old pod
    may still be listed, terminating, while its successor waits to be created."""
    return any(p["metadata"]["uid"] != old_uid and restarted_and_ready(p, {}) for p in pods)


def blocks_of(tokens: float, block_size: int) -> int:
    """Full blocks in ``tokens`` cached prompt tokens (only full blocks are cached)."""
    return int(tokens) // block_size


def crash(cluster: Cluster, pod: WalkPod, containers: Sequence[str]) -> float:
    """SIGKILL each container's own process, as a crash would, and wait until the runtime has
    restarted every one of them and the pod is Ready again; the seconds that took."""
    counts = restart_counts(_get(cluster, pod))
    before = {name: counts[name] for name in containers}
    for name in containers:
        pid = cluster.container_pid(pod.namespace, pod.name, name)
        if pid is None:
            raise RuntimeError(f"{pod.namespace}/{pod.name}: container {name} has no running process")
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    what = f"{pod.name}'s {' and '.join(containers)} to be restarted and the pod Ready"
    stack.wait_for(
        lambda: restarted_and_ready(_get(cluster, pod), before), RESTART_S, what=what, interval_s=1
    )
    return time.monotonic() - killed


def _get(cluster: Cluster, pod: WalkPod) -> dict[str, Any]:
    found: dict[str, Any] = cluster.kubectl_json("get", "pod", pod.name, "-n", pod.namespace)
    return found


def replace(cluster: Cluster, pod: WalkPod) -> float:
    """Delete the pod, as a drained node or ``kubectl delete pod`` would, and wait until its
    StatefulSet's new pod of the same name (a new UID) is Ready; the seconds that took."""
    old_uid = _get(cluster, pod)["metadata"]["uid"]
    started = time.monotonic()
    delete = ("delete", "pod", pod.name, "-n", pod.namespace, "--wait=true", f"--timeout={RESTART_S:.0f}s")
    cluster.kubectl(*delete, timeout_s=RESTART_S + 30)

    def replaced() -> bool:
        return replaced_and_ready(_named(cluster, pod.namespace, pod.name), old_uid)

    stack.wait_for(replaced, RESTART_S, what=f"a new {pod.name} to be Ready", interval_s=1)
    return time.monotonic() - started


def _named(cluster: Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    """The pods called ``name`` (none, or one, which may be terminating)."""
    found = cluster.kubectl_json("get", "pods", "-n", namespace, "--field-selector", f"metadata.name={name}")
    return list(found.get("items", []))


def second_replica(cluster: Cluster, pod: WalkPod, scale: Callable[[int], None]) -> tuple[str, float]:
    """Scale the service to two replicas, as load would, and wait until its StatefulSet's second
    pod (the next ordinal) is Ready; its name and the seconds that took."""
    name = f"{pod.name.rsplit('-', 1)[0]}-1"
    started = time.monotonic()
    scale(2)

    def ready() -> bool:
        return replaced_and_ready(_named(cluster, pod.namespace, name), "")  # any UID will do

    stack.wait_for(ready, RESTART_S, what=f"{name} to be Ready", interval_s=1)
    return name, time.monotonic() - started


def back_to_one(cluster: Cluster, pod: WalkPod, name: str, scale: Callable[[int], None]) -> None:
    """One replica again, and ``name`` gone: the scaling act that follows needs its room."""
    scale(1)

    def gone() -> bool:
        return not _named(cluster, pod.namespace, name)

    stack.wait_for(gone, RESTART_S, what=f"{name} to be gone", interval_s=1)


def wait_committed(pod: WalkPod, tokens: float) -> None:
    """Until the sidecar's NVMe index holds the blocks of ``tokens`` prompt tokens (committed:
    data synced, then the index record), so that a crash now cannot lose them."""
    wanted = blocks_of(tokens, pod.config.engine.block_size)
    stack.wait_for(
        lambda: dataplane.held_blocks(pod.kv_metrics)["nvme"] >= wanted,
        COMMITTED_S,
        what=f"{wanted} blocks committed on the NVMe tier",
    )


def walk(
    cluster: Cluster,
    pod: WalkPod,
    prompt_tokens: int,
    find_pod: Callable[[str | None], WalkPod],
    scale: Callable[[int], None],
) -> tuple[list[Row], WalkPod]:
    """The walk's rows, and the pod it ends at (the replaced pod's successor, found by
    ``find_pod``); ``scale`` pins the service's replicas for the shared tier's row."""
    prompt = dataplane.long_prompt(prompt_tokens)
    rows: list[Row] = []

    def measure(label: str, at: WalkPod | None = None) -> dict[str, float]:
        api = (at or pod).api
        before = dataplane.hit_tokens(api)
        ttft = dataplane.time_to_first_token(api, pod.config.model.name, prompt)
        after = dataplane.hit_tokens(api)
        rows.append((label, ttft, {t: after[t] - before[t] for t in TIERS}))
        print(f"  {label:<46} TTFT {ttft:6.3f} s", flush=True)
        return rows[-1][2]

    measure("cold (nothing cached)")
    measure("again: prefix in HBM")
    print(f"  SIGKILL to {pod.name}'s {ENGINE} process ...", flush=True)
    took = crash(cluster, pod, [ENGINE])
    print(f"  ... the pod runtime restarted it; {pod.name} Ready again after {took:.0f} s", flush=True)
    from_dram = measure("engine crashed: HBM empty, prefix in DRAM")
    wait_committed(pod, from_dram["dram"])
    print(f"  SIGKILL to {pod.name}'s {SIDECAR} and {ENGINE} processes ...", flush=True)
    took = crash(cluster, pod, [SIDECAR, ENGINE])
    print(f"  ... the pod runtime restarted both; Ready again after {took:.0f} s", flush=True)
    measure("both crashed: DRAM recovered, prefix in DRAM")
    print(f"  kubectl delete pod {pod.name} ...", flush=True)
    took = replace(cluster, pod)
    pod = find_pod(None)
    print(f"  ... its StatefulSet made a new {pod.name} ({pod.ip}); Ready after {took:.0f} s", flush=True)
    measure("pod replaced: DRAM gone, prefix on NVMe")
    print("  two replicas (kubectl patch: minReplicas = maxReplicas = 2) ...", flush=True)
    name, took = second_replica(cluster, pod, scale)
    other = find_pod(name)
    print(f"  ... {name} ({other.ip}), its own tiers empty; Ready after {took:.0f} s", flush=True)
    measure("second replica: prefix on the shared volume", at=other)
    back_to_one(cluster, pod, name, scale)
    return rows, pod


def table(rows: Sequence[Row]) -> list[str]:
    cold = rows[0][1]
    lines = [f"{'request':<46}{'TTFT s':>9}{'vs cold':>9}   prompt tokens served from"]
    for label, ttft, hits in rows:
        served = ", ".join(f"{t} {int(n)}" for t, n in hits.items() if n) or "none (recomputed)"
        lines.append(f"{label:<46}{ttft:>9.3f}{cold / ttft:>8.1f}x   {served}")
    return lines
