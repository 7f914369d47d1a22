"""Waiting on pods that fails fast: each poll classifies the pods (``podstate``) and a stuck one
ends the wait at once, naming its container, why, and the last lines that container printed."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from strata.cluster.cluster import Cluster
from strata.cluster.podstate import PodState, classify
from strata.cluster.processes import wait_until

LOG_LINES = 20
POLL_S = 1.0
Pod = dict[str, Any]


class PodStuck(AssertionError):
    """A pod cannot become Ready by waiting; the message names the container and quotes its log.
    An AssertionError, so a test reports it as a failure."""


def stuck_message(cluster: Cluster, pod: Pod, state: PodState) -> str:
    """The state's reason, with the container's last lines when the local runtime ran it (the
    run that failed: a container waiting to restart has not started a new log yet)."""
    meta = pod["metadata"]
    text = state.describe(meta["name"])
    if not state.container:
        return text
    log = cluster.container_log(meta["namespace"], meta["name"], state.container)
    tail = "\n".join(log.splitlines()[-LOG_LINES:])
    return f"{text}\nits last lines:\n{tail}" if tail else text


def raise_if_stuck(cluster: Cluster, pods: Sequence[Pod]) -> None:
    """PodStuck for the first of ``pods`` that cannot become Ready by waiting."""
    for pod in pods:
        state = classify(pod)
        if state.phase == "stuck":
            raise PodStuck(stuck_message(cluster, pod, state))


def read_pod(cluster: Cluster, namespace: str, name: str) -> Pod | None:
    out = cluster.kubectl("get", "pod", name, "-n", namespace, "--ignore-not-found", "-o", "json").stdout
    return json.loads(out) if out.strip() else None


def wait_pod_ready(cluster: Cluster, namespace: str, name: str, timeout_s: float) -> Pod:
    """Pod ``namespace/name`` once Ready; PodStuck as soon as it cannot become Ready."""

    def ready() -> Pod | None:
        pod = read_pod(cluster, namespace, name)
        if pod is None:
            return None
        raise_if_stuck(cluster, [pod])
        return pod if classify(pod).phase == "ready" else None

    return wait_until(ready, timeout_s, f"pod {namespace}/{name} to be Ready", interval_s=POLL_S)
