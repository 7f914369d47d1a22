"""The local pod runtime on the session cluster's local node: pods that really run.

Each test runs a small app (tests/foundation/podapp.py) or a shell as the pod's containers and
checks what Kubernetes reports (status, restarts, events) against what really happened.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from strata.cluster import Cluster
from strata.cluster.cli import pid_alive
from strata.cluster.nodes import LOCAL_TOLERATION, POD_RUNTIME_LABEL, POD_RUNTIME_LOCAL
from strata.cluster.podwait import wait_pod_ready
from tests.foundation.waiting import WAIT_S, eventually

pytestmark = pytest.mark.cluster
LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")
POD_IP = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def app(name: str = "app", **fields: Any) -> dict[str, Any]:
    """A container running podapp, ready once it answers on its pod IP."""
    env = [POD_IP, *fields.pop("env", [])]
    return {
        "name": name,
        "image": "strata-test",
        "command": ["python", "-m", "tests.foundation.podapp"],
        "env": env,
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
        **fields,
    }


def shell(name: str, script: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": "busybox", "command": ["sh", "-c", script], **fields}


def local_pod(name: str, containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeSelector": {POD_RUNTIME_LABEL: POD_RUNTIME_LOCAL},
            "tolerations": [LOCAL_TOLERATION],
            "terminationGracePeriodSeconds": 5,
            "containers": containers,
            **spec,
        },
    }


def get_pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    out = cluster.kubectl("get", "pod", name, "-n", namespace, "--ignore-not-found", "-o", "json").stdout
    return json.loads(out) if out.strip() else None


def condition(pod: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for cond in ((pod or {}).get("status") or {}).get("conditions", []):
        if cond["type"] == type_:
            return dict(cond)
    return {}


def ready_pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    """The pod once Ready; PodStuck at once when a container of it cannot start."""
    return wait_pod_ready(cluster, namespace, name, WAIT_S)


def fetch(ip: str, port: int = 8080) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{ip}:{port}/", timeout=WAIT_S) as reply:
        result: dict[str, Any] = json.load(reply)
        return result


def container_status(pod: dict[str, Any], name: str) -> dict[str, Any]:
    listed = [*pod["status"].get("initContainerStatuses", []), *pod["status"].get("containerStatuses", [])]
    return next(s for s in listed if s["name"] == name)


def test_every_address_the_cluster_hands_out_is_loopback(cluster: Cluster, namespace: str) -> None:
    kwok_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "kwok"},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/x:1"}]},
    }
    cluster.apply(kwok_pod, namespace)
    cluster.apply(local_pod("local", [app()]), namespace)
    ready_pod(cluster, namespace, "local")
    eventually(
        lambda: (get_pod(cluster, namespace, "kwok") or {}).get("status", {}).get("podIP"),
        "the KWOK pod's IP",
    )
    cluster.kubectl("create", "service", "clusterip", "svc", "--tcp=80:8080", "-n", namespace)
    pods = cluster.kubectl_json("get", "pods", "-A")["items"]
    addresses = [p["status"].get(k) for p in pods for k in ("podIP", "hostIP") if p["status"].get(k)]
    nodes = cluster.kubectl_json("get", "nodes")["items"]
    ranges = [ipaddress.IPv4Network(n["spec"]["podCIDR"]) for n in nodes]
    services = cluster.kubectl_json("get", "services", "-A")["items"]
    addresses += [
        s["spec"]["clusterIP"] for s in services if s["spec"].get("clusterIP") not in (None, "None")
    ]
    assert len(addresses) >= 5 and len(ranges) == len(nodes)
    outside = [a for a in addresses if ipaddress.ip_address(a) not in LOOPBACK]
    outside += [str(r) for r in ranges if not r.subnet_of(LOOPBACK)]
    assert not outside, f"addresses outside 127.0.0.0/8: {outside}"


def test_a_pod_runs_for_real_with_its_environment_volumes_and_service_account(
    cluster: Cluster, namespace: str
) -> None:
    cluster.kubectl("create", "configmap", "greeting", "--from-literal=text=hello", "-n", namespace)
    env = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "greeting", "key": "text"}}},
        {"name": "SHOW_FILES", "value": "/etc/greeting/text"},
        {"name": "SHOW_SIZE", "value": "/dev/shm"},
    ]
    mounts = [{"name": "greeting", "mountPath": "/etc/greeting"}, {"name": "shm", "mountPath": "/dev/shm"}]
    volumes = [
        {"name": "greeting", "configMap": {"name": "greeting"}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
    ]
    container = app(env=env, volumeMounts=mounts, securityContext={"readOnlyRootFilesystem": True})
    cluster.apply(local_pod("real", [container], volumes=volumes), namespace)
    pod = ready_pod(cluster, namespace, "real")
    seen = fetch(pod["status"]["podIP"])
    assert seen["hostname"] == "real" and seen["pid"] == 1
    assert seen["env"]["POD_IP"] == pod["status"]["podIP"] and seen["env"]["POD_NAME"] == "real"
    assert seen["env"]["GREETING"] == "hello" and seen["files"] == {"/etc/greeting/text": "hello"}
    assert seen["size_bytes"] == 64 * 2**20 and seen["root_writable"] is False
    assert not Path("/etc/greeting").exists(), "the mount point must be made in the container's root only"
    assert seen["identity"]["username"] == f"system:serviceaccount:{namespace}:default"
    assert seen["identity"]["extra"]["authentication.kubernetes.io/pod-name"] == ["real"]
    assert "serving on" in cluster.container_log(namespace, "real", "app")


def test_init_containers_then_a_started_sidecar_then_the_main_container(
    cluster: Cluster, namespace: str
) -> None:
    order = [{"name": "work", "mountPath": "/order"}]
    sidecar = shell(
        "sidecar",
        "echo sidecar >> /order/log; touch /order/up; exec sleep 3600",
        restartPolicy="Always",
        volumeMounts=order,
        startupProbe={"exec": {"command": ["test", "-f", "/order/up"]}, "periodSeconds": 1},
    )
    init = [shell("first", "echo first >> /order/log", volumeMounts=order), sidecar]
    main = app(env=[{"name": "SHOW_FILES", "value": "/order/log"}], volumeMounts=order)
    manifest = local_pod("ordered", [main], initContainers=init, volumes=[{"name": "work", "emptyDir": {}}])
    cluster.apply(manifest, namespace)
    pod = ready_pod(cluster, namespace, "ordered")
    assert fetch(pod["status"]["podIP"])["files"]["/order/log"] == "first\nsidecar\n"
    assert container_status(pod, "first")["state"]["terminated"]["reason"] == "Completed"
    assert container_status(pod, "sidecar")["started"] is True


def test_a_killed_container_is_restarted_and_its_pod_goes_unready_then_ready(
    cluster: Cluster, namespace: str
) -> None:
    cluster.apply(local_pod("victim", [app()]), namespace)
    before = ready_pod(cluster, namespace, "victim")
    became_ready = condition(before, "Ready")["lastTransitionTime"]
    pid = cluster.container_pid(namespace, "victim", "app")
    assert pid is not None and pid_alive(pid)
    time.sleep(1.1)  # transition times have one-second resolution
    os.kill(pid, signal.SIGKILL)

    def restarted_and_ready() -> dict[str, Any] | None:
        pod = get_pod(cluster, namespace, "victim")
        ready = condition(pod, "Ready")
        again = ready.get("status") == "True" and ready["lastTransitionTime"] > became_ready
        return pod if pod and again and container_status(pod, "app")["restartCount"] == 1 else None

    after = eventually(restarted_and_ready, "the killed container restarted and ready again")
    last = container_status(after, "app")["lastState"]["terminated"]
    assert last["exitCode"] == 137 and last["reason"] == "Error"
    assert cluster.container_pid(namespace, "victim", "app") not in (None, pid)
    assert "serving on" in cluster.container_log(namespace, "victim", "app", previous=True)


def test_deleting_a_pod_sends_sigterm_then_sigkill_after_the_grace_period(
    cluster: Cluster, namespace: str
) -> None:
    stubborn = app(env=[{"name": "TERM_DELAY_S", "value": "-1"}])  # logs SIGTERM, never exits
    cluster.apply(local_pod("stubborn", [stubborn], terminationGracePeriodSeconds=2), namespace)
    ready_pod(cluster, namespace, "stubborn")
    pid = cluster.container_pid(namespace, "stubborn", "app")
    cluster.kubectl("delete", "pod", "stubborn", "-n", namespace, "--wait=false")
    eventually(lambda: get_pod(cluster, namespace, "stubborn") is None, "the pod object removed")
    assert pid is not None and not pid_alive(pid)
    assert "got SIGTERM" in cluster.container_log(namespace, "stubborn", "app")


def test_a_pod_shutting_down_is_not_killed_for_failing_liveness_while_it_drains(
    cluster: Cluster, namespace: str
) -> None:
    probe = {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1, "failureThreshold": 1}
    draining = app(env=[{"name": "TERM_DELAY_S", "value": "4"}, {"name": "TERM_UNHEALTHY", "value": "1"}])
    started = {**probe, "failureThreshold": 300}  # liveness from the first answer on
    probes = {"startupProbe": started, "livenessProbe": probe}
    pod = local_pod("draining", [{**draining, **probes}], terminationGracePeriodSeconds=60)
    cluster.apply(pod, namespace)
    ready_pod(cluster, namespace, "draining")
    cluster.kubectl("delete", "pod", "draining", "-n", namespace, "--wait=false")
    eventually(lambda: get_pod(cluster, namespace, "draining") is None, "the pod object removed")
    log = cluster.container_log(namespace, "draining", "app")
    assert "got SIGTERM" in log and "podapp: exiting" in log, log  # drained its 4 s, not killed
    events = cluster.kubectl(
        "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=draining", "-o", "json"
    ).stdout
    messages = [e["message"] for e in json.loads(events)["items"]]
    assert not [m for m in messages if "failed liveness probe" in m], messages


def test_pods_that_finish_report_succeeded_and_failed_with_exit_codes(
    cluster: Cluster, namespace: str
) -> None:
    cluster.apply(local_pod("ok", [shell("c", "exit 0")], restartPolicy="Never"), namespace)
    cluster.apply(local_pod("bad", [shell("c", "echo oops; exit 3")], restartPolicy="Never"), namespace)

    def phase(name: str) -> str | None:
        pod = get_pod(cluster, namespace, name)
        done = pod and pod["status"].get("phase") in ("Succeeded", "Failed")
        return pod["status"]["phase"] if done and pod else None

    assert eventually(lambda: phase("ok"), "pod ok to finish") == "Succeeded"
    assert eventually(lambda: phase("bad"), "pod bad to finish") == "Failed"
    bad = get_pod(cluster, namespace, "bad")
    assert bad is not None and container_status(bad, "c")["state"]["terminated"]["exitCode"] == 3
    assert cluster.container_log(namespace, "bad", "c") == "oops\n"


def _container_processes(cluster: Cluster, namespace: str, pod: str) -> list[int]:
    pid = cluster.container_pid(namespace, pod, "c")
    assert pid is not None
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *(int(c) for c in children)]


def test_a_killed_runtime_leaves_no_process_and_its_successor_restarts_the_pods(
    cluster: Cluster, namespace: str
) -> None:
    # A shell that leaves a child behind, the way a daemonising process would.
    script = "sleep 3600 & touch /tmp/up; exec sleep 3600"
    probe = {"exec": {"command": ["test", "-f", "/tmp/up"]}, "periodSeconds": 1}
    cluster.apply(local_pod("survivor", [shell("c", script, readinessProbe=probe)]), namespace)
    ready_pod(cluster, namespace, "survivor")
    pids = _container_processes(cluster, namespace, "survivor")
    assert len(pids) == 2
    runtime = next(p for p in cluster.owned_processes if p.name == "pod-runtime")
    runtime.popen.send_signal(signal.SIGKILL)
    runtime.popen.wait(WAIT_S)
    eventually(
        lambda: not any(pid_alive(p) for p in pids), "every process of the killed runtime's pods to go"
    )

    cluster.restart_component("pod-runtime")

    def restarted() -> dict[str, Any] | None:
        pod = get_pod(cluster, namespace, "survivor")
        ok = pod and condition(pod, "Ready").get("status") == "True"
        return pod if ok and pod and container_status(pod, "c")["restartCount"] == 1 else None

    pod = eventually(restarted, "the pod restarted by the new runtime and Ready")
    assert container_status(pod, "c")["lastState"]["terminated"]["reason"] == "ContainerStatusUnknown"


def test_a_pod_wanting_more_cpu_than_the_local_nodes_have_stays_pending_and_is_told_why(
    cluster: Cluster, namespace: str
) -> None:
    greedy = shell("c", "exit 0", resources={"requests": {"cpu": "64"}})
    cluster.apply(local_pod("greedy", [greedy]), namespace)

    def told() -> list[dict[str, Any]]:
        listed = cluster.kubectl_json("get", "events", "-n", namespace)["items"]
        return [e for e in listed if e["reason"] == "InsufficientLocalCPU"]

    (event,) = eventually(told, "the runtime's InsufficientLocalCPU event")
    assert event["type"] == "Warning" and "this pod 64" in event["message"]
    pod = get_pod(cluster, namespace, "greedy")
    assert pod is not None and pod["status"]["phase"] == "Pending"
    assert "Insufficient cpu" in condition(pod, "PodScheduled")["message"]
