"""The kubelet endpoint, node addresses, component flags, pod classification and the stack's
service wait, without a cluster: each decision is a pure function."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

from strata.cluster import components, nodes, podstate
from strata.cluster.podruntime import kubeletapi, launch
from strata.cluster.podruntime.host import image_env
from strata.cluster.podruntime.mounts import Mount, environment_mounts, image_mount
from strata.cluster.podruntime.nodeagent import node_status
from strata.stack import kube

LOG = b"one\ntwo\nthree\n"


def test_the_log_query_takes_the_kubelets_options() -> None:
    query = kubeletapi.parse_log_query(
        {"tailLines": "2", "limitBytes": "9", "previous": "true", "timestamps": "true", "follow": "false"}
    )
    assert query == kubeletapi.LogQuery(tail_lines=2, limit_bytes=9, previous=True, timestamps=True)
    assert kubeletapi.parse_log_query({}) == kubeletapi.LogQuery()


@pytest.mark.parametrize("params", [{"tailLines": "x"}, {"tailLines": "-1"}, {"limitBytes": "0"}])
def test_a_bad_log_option_is_named(params: dict[str, str]) -> None:
    with pytest.raises(ValueError, match=next(iter(params))):
        kubeletapi.parse_log_query(params)


@pytest.mark.parametrize("name", ["*", "..", "a/b", "A", ""])
def test_names_that_are_no_object_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="not an object name"):
        kubeletapi.check_names("default", name)


def test_tail_then_timestamps_then_limit() -> None:
    assert kubeletapi.shape_log(LOG, kubeletapi.LogQuery(tail_lines=2), 0) == b"two\nthree\n"
    assert kubeletapi.shape_log(LOG, kubeletapi.LogQuery(tail_lines=0), 0) == b""
    assert kubeletapi.shape_log(LOG, kubeletapi.LogQuery(limit_bytes=5), 0) == b"one\nt"
    stamped = kubeletapi.shape_log(LOG, kubeletapi.LogQuery(tail_lines=1, timestamps=True), 0)
    assert stamped == b"1970-01-01T00:00:00.000000000Z three\n"


def test_only_the_apiservers_kubelet_client_is_served() -> None:
    def peer(cn: str) -> dict[str, Any]:
        return {"subject": ((("organizationName", "system:masters"),), (("commonName", cn),))}

    assert kubeletapi.authorized(peer("kube-apiserver-kubelet-client"))
    assert not kubeletapi.authorized(peer("strata-admin"))
    assert not kubeletapi.authorized(None)


def test_every_node_carries_a_loopback_internal_ip() -> None:
    shape = nodes.GpuNodeShape()
    made = [
        nodes.gpu_node_manifest("gpu-node-0", 0, shape, "127.64.1.0/24")["status"],
        nodes.local_node_manifest("local-node-0", 0, shape, "127.64.2.0/24", "2", "1Gi")["status"],
        node_status("local-node-0", 0.0, None, 10250),
    ]
    for status in made:
        internal = [a["address"] for a in status["addresses"] if a["type"] == "InternalIP"]
        assert internal == ["127.0.0.1"]
    assert made[2]["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 10250}}


def test_the_apiserver_dials_nodes_by_internal_ip_with_a_client_cert(tmp_path: Path) -> None:
    layout = components.Layout(tmp_path)
    ports = components.Ports(1, 2, 3, 4, 5)
    argv = components.apiserver_argv(Path("bin"), layout, ports, components.Networks())
    flags = dict(a.removeprefix("--").split("=", 1) for a in argv[1:])
    assert flags["kubelet-preferred-address-types"].split(",")[0] == "InternalIP"
    for flag in ("kubelet-client-certificate", "kubelet-client-key", "kubelet-certificate-authority"):
        assert flags[flag].startswith(str(layout.pki))
    runtime = components.pod_runtime_argv(layout, components.Networks())
    assert f"--client-ca={layout.pki / 'ca.crt'}" in runtime


def test_no_component_is_given_a_host_name_to_dial(tmp_path: Path) -> None:
    layout, networks = components.Layout(tmp_path), components.Networks()
    ports = components.Ports(1, 2, 3, 4, 5)
    argvs = [
        components.etcd_argv(Path("bin"), layout, ports),
        components.apiserver_argv(Path("bin"), layout, ports, networks),
        components.kwok_argv(Path("bin"), layout, networks, Path("stages.yaml")),
    ]
    # The service-account issuer is a name tokens carry, never dialed.
    urls = [
        a.split("=", 1)[1]
        for argv in argvs
        for a in argv
        if "://" in a and not a.startswith("--service-account-issuer=")
    ]
    assert urls and all("//127.0.0.1:" in url for url in urls), urls
    assert "--node-ip=127.0.0.1" in argvs[2]


def test_a_checkout_under_tmp_keeps_its_virtualenv_over_a_tmp_volume() -> None:
    venv = Path("/tmp/clone/.venv")
    mounts = [
        image_mount("/tmp/clone"),
        Mount("/cluster/pods/p/volumes/tmp", "/tmp", read_only=False),
        *environment_mounts([venv]),
    ]
    specs = [dataclasses.asdict(m) for m in mounts]
    order = [m["target"] for m in launch.mount_order(list(reversed(specs)))]
    assert order.index("/tmp") < order.index(str(venv))
    assert image_env(6443)["PATH"].split(":")[0] == str(Path(sys.executable).parent)


def status(**fields: Any) -> dict[str, Any]:
    return {"status": {"phase": "Pending", **fields}}


def entry(name: str, state: dict[str, Any], last: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "state": state, "lastState": {"terminated": last} if last else {}}


READY = [{"type": "Ready", "status": "True"}]


def test_a_ready_pod_and_a_starting_one() -> None:
    assert podstate.classify(status(phase="Running", conditions=READY)).phase == "ready"
    creating = entry("engine", {"waiting": {"reason": "ContainerCreating"}})
    assert podstate.classify(status(containerStatuses=[creating])).phase == "progressing"


def test_a_container_that_cannot_start_is_stuck_with_its_error() -> None:
    failed = {"reason": "StartError", "exitCode": 128, "message": "exec nope: No such file or directory"}
    pod = status(containerStatuses=[entry("engine", {"terminated": failed})])
    state = podstate.classify(pod)
    assert (state.phase, state.container) == ("stuck", "engine")
    assert "exec nope: No such file or directory" in state.reason


def test_a_crash_loop_is_stuck_unless_the_container_was_killed() -> None:
    loop = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}}
    crashed = status(containerStatuses=[entry("engine", loop, {"exitCode": 1, "reason": "Error"})])
    killed = status(containerStatuses=[entry("engine", loop, {"exitCode": 137, "reason": "Error"})])
    assert podstate.classify(crashed).phase == "stuck"
    assert "exit code 1" in podstate.classify(crashed).reason
    assert podstate.classify(killed).phase == "progressing"


@pytest.mark.parametrize("reason", ["ImagePullBackOff", "CreateContainerConfigError", "CreateContainerError"])
def test_waiting_reasons_that_waiting_does_not_cure(reason: str) -> None:
    pod = status(containerStatuses=[entry("engine", {"waiting": {"reason": reason, "message": "m"}})])
    assert podstate.classify(pod) == podstate.PodState("stuck", "engine", f"{reason}: m")


def test_a_failed_init_container_is_stuck_but_a_sidecars_exit_is_not() -> None:
    failed = {"terminated": {"exitCode": 1, "reason": "Error"}}
    pod = status(initContainerStatuses=[entry("prepare", failed)])
    assert podstate.classify(pod).container == "prepare"
    assert "init container failed" in podstate.classify(pod).reason
    sidecar = {**pod, "spec": {"initContainers": [{"name": "prepare", "restartPolicy": "Always"}]}}
    assert podstate.classify(sidecar).phase == "progressing"


def test_a_failed_pod_is_stuck() -> None:
    state = podstate.classify({"status": {"phase": "Failed", "reason": "Evicted"}})
    assert state.phase == "stuck" and "Evicted" in state.describe("p")


def test_a_node_the_runtime_cannot_serve_is_unavailable_not_just_unready() -> None:
    broken = {"status": node_status("local-node-0", 0.0, "needs mount namespaces", 0)}
    fine = {"status": node_status("local-node-0", 0.0, None, 0)}
    assert nodes.node_problem(broken) == "PodRuntimeUnavailable: needs mount namespaces"
    assert not nodes.node_ready(broken)
    assert nodes.node_problem(fine) is None and nodes.node_ready(fine)
    assert nodes.node_problem({}) is None and not nodes.node_ready({})


def accepted(status: str, reason: str) -> dict[str, Any]:
    condition = {"type": "Accepted", "status": status, "reason": reason, "message": "m"}
    return {"status": {"conditions": [condition]}}


def test_a_service_whose_spec_is_refused_is_stuck_one_waiting_for_its_tier_is_not() -> None:
    assert kube.refusal(accepted("False", "InvalidSpec")) == "Accepted=False InvalidSpec: m"
    assert kube.refusal(accepted("False", "TierNotFound")) is None  # the tier may yet be created
    assert kube.refusal(accepted("True", "")) is None
    assert kube.refusal(None) is None
