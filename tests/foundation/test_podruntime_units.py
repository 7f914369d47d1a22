"""The local pod runtime's decisions, without a cluster: start order, restarts and back-off,
phase and conditions, environment and command expansion, mounts, pod IPs, probe thresholds."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from strata.cluster import ranges
from strata.cluster.nodes import LOCAL_TOLERATION
from strata.cluster.podruntime import capacity, decide, network, probes, records, status
from strata.cluster.podruntime import env as envs
from strata.cluster.podruntime.mounts import Mount, PodDirs, container_mounts
from strata.cluster.podruntime.records import ContainerRecord
from strata.cluster.podruntime.spec import Pod, parse_pod

T0 = 1_000_000.0


def pod(
    containers: list[dict[str, Any]],
    init: list[dict[str, Any]] | None = None,
    policy: str = "Always",
    **spec: Any,
) -> Pod:
    return parse_pod(
        {
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"app": "a"}},
            "spec": {
                "nodeName": "local-node-0",
                "restartPolicy": policy,
                "containers": containers,
                "initContainers": init or [],
                **spec,
            },
        }
    )


def c(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "image": "x", "command": ["true"], **fields}


def fresh(p: Pod) -> dict[str, ContainerRecord]:
    return {x.name: ContainerRecord(x.name) for x in (*p.spec.init_containers, *p.spec.containers)}


def run(recs: dict[str, ContainerRecord], name: str, now: float = T0, gated: bool = False) -> None:
    recs[name] = records.started(recs[name], now, has_startup_gate=gated)


def finish(recs: dict[str, ContainerRecord], name: str, code: int, now: float = T0) -> None:
    recs[name] = records.exited(recs[name], code, records.exit_reason(code), now)


STARTUP = {"startupProbe": {"exec": {"command": ["true"]}}}


class TestStartOrder:
    def test_init_containers_run_one_at_a_time_then_all_main_containers_together(self) -> None:
        p = pod([c("a"), c("b")], init=[c("i1"), c("i2")])
        recs = fresh(p)
        assert decide.plan(p, recs, T0).start == ("i1",)
        run(recs, "i1")
        assert decide.plan(p, recs, T0).start == ()
        finish(recs, "i1", 0)
        assert decide.plan(p, recs, T0).start == ("i2",)
        run(recs, "i2")
        finish(recs, "i2", 0)
        assert decide.plan(p, recs, T0).start == ("a", "b")

    def test_a_sidecar_must_be_started_before_the_next_init_container(self) -> None:
        p = pod([c("main")], init=[c("side", restartPolicy="Always", **STARTUP), c("later")])
        recs = fresh(p)
        assert decide.plan(p, recs, T0).start == ("side",)
        run(recs, "side", gated=True)
        assert decide.plan(p, recs, T0).start == ()  # running, startup probe not passed yet
        recs["side"] = records.probed(recs["side"], "startup", True)
        assert decide.plan(p, recs, T0).start == ("later",)

    def test_a_failed_init_container_fails_the_pod_under_restart_policy_never(self) -> None:
        p = pod([c("main")], init=[c("i")], policy="Never")
        recs = fresh(p)
        run(recs, "i")
        finish(recs, "i", 3)
        assert decide.plan(p, recs, T0).failed
        assert decide.phase(p, recs) == "Failed"

    def test_a_failed_init_container_is_retried_under_restart_policy_always(self) -> None:
        p = pod([c("main")], init=[c("i")])
        recs = fresh(p)
        run(recs, "i")
        finish(recs, "i", 1)
        assert decide.plan(p, recs, T0).start == ("i",)
        assert decide.phase(p, recs) == "Pending"

    def test_a_pod_being_deleted_starts_nothing(self) -> None:
        p = pod([c("a")])
        p = p.model_copy(update={"metadata": p.metadata.model_copy(update={"deletion_timestamp": "now"})})
        assert decide.plan(p, fresh(p), T0).start == ()


class TestRestarts:
    @pytest.mark.parametrize(
        ("policy", "code", "restarts"),
        [
            ("Always", 0, True),
            ("Always", 1, True),
            ("OnFailure", 0, False),
            ("OnFailure", 2, True),
            ("Never", 1, False),
        ],
    )
    def test_restart_policy(self, policy: str, code: int, restarts: bool) -> None:
        p = pod([c("a")], policy=policy)
        recs = fresh(p)
        run(recs, "a")
        finish(recs, "a", code)
        assert (decide.plan(p, recs, T0).start == ("a",)) is restarts

    def test_back_off_is_immediate_then_10_s_doubling_to_5_minutes(self) -> None:
        rec, now, delays = ContainerRecord("a"), T0, []
        for _ in range(8):
            rec = records.started(rec, now, has_startup_gate=False)
            now += 1
            rec = records.exited(rec, 1, "Error", now)
            delays.append(rec.backoff_until - now)
            now = rec.backoff_until
        assert delays == [0, 10, 20, 40, 80, 160, 300, 300]

    def test_back_off_starts_over_after_ten_quiet_minutes(self) -> None:
        rec = ContainerRecord("a")
        for now in (T0, T0 + 1, T0 + 20):
            rec = records.exited(records.started(rec, now, has_startup_gate=False), 1, "Error", now + 0.5)
        assert rec.backoff_until > T0 + 20.5
        rec = records.exited(records.started(rec, T0 + 100, has_startup_gate=False), 1, "Error", T0 + 800)
        assert rec.backoff_until == T0 + 800

    def test_waiting_for_back_off_wakes_the_planner_when_it_ends(self) -> None:
        p = pod([c("a")])
        recs = fresh(p)
        for _ in range(2):
            run(recs, "a")
            finish(recs, "a", 1)
        step = decide.plan(p, recs, T0 + 1)
        assert step.start == () and step.wake_at == T0 + 10

    def test_restart_count_grows_and_last_state_keeps_the_previous_exit(self) -> None:
        recs = {"a": ContainerRecord("a")}
        run(recs, "a")
        finish(recs, "a", 137, T0 + 5)
        run(recs, "a", T0 + 6)
        assert recs["a"].restarts == 1
        assert recs["a"].last_exit is not None and recs["a"].last_exit.code == 137

    def test_sidecars_are_restarted_while_main_containers_run_and_not_after(self) -> None:
        p = pod([c("main")], init=[c("side", restartPolicy="Always")], policy="Never")
        recs = fresh(p)
        run(recs, "side")
        run(recs, "main")
        finish(recs, "side", 1)
        assert decide.plan(p, recs, T0).start == ("side",)
        finish(recs, "main", 0)
        assert decide.main_containers_finished(p, recs)
        assert decide.plan(p, recs, T0).start == ()
        assert decide.phase(p, recs) == "Succeeded"


class TestPhase:
    def test_pending_until_every_main_container_ran(self) -> None:
        p = pod([c("a"), c("b")])
        recs = fresh(p)
        assert decide.phase(p, recs) == "Pending"
        run(recs, "a")
        assert decide.phase(p, recs) == "Pending"
        run(recs, "b")
        assert decide.phase(p, recs) == "Running"

    @pytest.mark.parametrize(
        ("policy", "codes", "expected"),
        [
            ("Never", (0, 0), "Succeeded"),
            ("Never", (0, 1), "Failed"),
            ("OnFailure", (0, 1), "Running"),
            ("Always", (0, 0), "Running"),
        ],
    )
    def test_after_every_main_container_exited(
        self, policy: str, codes: tuple[int, int], expected: str
    ) -> None:
        p = pod([c("a"), c("b")], policy=policy)
        recs = fresh(p)
        for name, code in zip(("a", "b"), codes, strict=True):
            run(recs, name)
            finish(recs, name, code)
        assert decide.phase(p, recs) == expected

    def test_containers_lost_with_a_previous_runtime_are_restarted_without_reinitialising(self) -> None:
        p = pod([c("main")], init=[c("fetch"), c("side", restartPolicy="Always")])
        before = {
            "fetch": {
                "name": "fetch",
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
            },
            "side": {"name": "side", "restartCount": 2, "state": {"running": {}}},
            "main": {"name": "main", "restartCount": 1, "state": {"running": {}}},
        }
        recs = {name: records.adopted_from_status(name, s, T0) for name, s in before.items()}
        assert decide.initialized(p, recs)
        assert decide.plan(p, recs, T0).start == ("side", "main")
        run(recs, "main")
        assert recs["main"].restarts == 2
        assert (
            recs["main"].last_exit is not None and recs["main"].last_exit.reason == "ContainerStatusUnknown"
        )


def conditions_of(built: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {x["type"]: x for x in built["conditions"]}


ADDRESSES = status.Addresses("127.64.1.2", "127.0.0.1", T0)


class TestStatus:
    def test_running_and_ready_pod(self) -> None:
        p = pod([c("a")])
        recs = fresh(p)
        run(recs, "a")
        recs["a"] = dataclasses.replace(recs["a"], ready=True)
        built = status.pod_status(p, recs, ADDRESSES, [], T0)
        assert built["phase"] == "Running" and built["podIP"] == "127.64.1.2"
        assert conditions_of(built)["Ready"]["status"] == "True"
        assert conditions_of(built)["Ready"]["reason"] is None  # clears a reason an earlier patch set
        (entry,) = built["containerStatuses"]
        assert entry["ready"] and entry["started"] and "running" in entry["state"]

    def test_crash_looping_container_waits_with_its_last_exit(self) -> None:
        p = pod([c("a")])
        recs = fresh(p)
        for now in (T0, T0 + 1):
            run(recs, "a", now)
            finish(recs, "a", 2, now + 0.5)
        entry = status.pod_status(p, recs, ADDRESSES, [], T0 + 2)["containerStatuses"][0]
        assert entry["state"]["waiting"]["reason"] == "CrashLoopBackOff"
        assert "back-off 10s" in entry["state"]["waiting"]["message"]
        assert entry["lastState"]["terminated"]["exitCode"] == 2 and entry["restartCount"] == 1

    def test_unready_pod_names_its_unready_containers(self) -> None:
        p = pod([c("a"), c("b")])
        recs = fresh(p)
        run(recs, "a")
        run(recs, "b")
        recs["a"] = dataclasses.replace(recs["a"], ready=True)
        ready = conditions_of(status.pod_status(p, recs, ADDRESSES, [], T0))["Ready"]
        assert ready["status"] == "False" and ready["message"] == "containers with unready status: [b]"

    def test_readiness_gates_hold_the_pod_unready(self) -> None:
        p = pod([c("a")], readinessGates=[{"conditionType": "example.com/lb"}])
        recs = fresh(p)
        run(recs, "a")
        recs["a"] = dataclasses.replace(recs["a"], ready=True)
        gate_false = [{"type": "example.com/lb", "status": "False"}]
        assert (
            conditions_of(status.pod_status(p, recs, ADDRESSES, gate_false, T0))["Ready"]["status"] == "False"
        )
        gate_true = [{"type": "example.com/lb", "status": "True"}]
        assert (
            conditions_of(status.pod_status(p, recs, ADDRESSES, gate_true, T0))["Ready"]["status"] == "True"
        )

    def test_transition_time_is_kept_while_a_condition_holds(self) -> None:
        p = pod([c("a")])
        recs = fresh(p)
        first = status.pod_status(p, recs, ADDRESSES, [], T0)["conditions"]
        again = status.pod_status(p, recs, ADDRESSES, first, T0 + 60)["conditions"]
        assert first == again
        run(recs, "a")
        recs["a"] = dataclasses.replace(recs["a"], ready=True)
        later = conditions_of(status.pod_status(p, recs, ADDRESSES, again, T0 + 60))
        assert later["Ready"]["lastTransitionTime"] == status.timestamp(T0 + 60)

    def test_completed_init_container_is_ready_and_main_containers_wait_for_initialisation(self) -> None:
        p = pod([c("main")], init=[c("i")])
        recs = fresh(p)
        before = status.pod_status(p, recs, ADDRESSES, [], T0)
        assert before["containerStatuses"][0]["state"]["waiting"]["reason"] == "PodInitializing"
        assert conditions_of(before)["Initialized"]["message"] == "containers with incomplete status: [i]"
        run(recs, "i")
        finish(recs, "i", 0)
        after = status.pod_status(p, recs, ADDRESSES, [], T0)
        assert after["initContainerStatuses"][0]["ready"] is True
        assert after["initContainerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"


FACTS_POD = pod([c("a")])


def facts(p: Pod = FACTS_POD) -> envs.PodFacts:
    return envs.PodFacts(p, "127.64.1.7", "127.0.0.1", {"cpu": "2"})


class TestEnvironment:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("$(A)-$(B)", "1-2"),
            ("$(MISSING)", "$(MISSING)"),
            ("$$(A)", "$(A)"),
            ("a$b", "a$b"),
            ("$(A", "$(A"),
            ("$$$(A)", "$1"),
        ],
    )
    def test_expansion_follows_kubernetes(self, text: str, expected: str) -> None:
        assert envs.expand(text, {"A": "1", "B": "2"}) == expected

    def test_downward_api_and_earlier_variables(self) -> None:
        container = pod(
            [
                c(
                    "a",
                    env=[
                        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                        {"name": "URL", "value": "http://$(POD_IP):8000"},
                        {"name": "CPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                    ],
                )
            ]
        ).spec.containers[0]
        env = envs.container_env(container, facts(), {}, {"PATH": "/bin"})
        assert env["URL"] == "http://127.64.1.7:8000" and env["NS"] == "ns" and env["APP"] == "a"
        assert env["CPUS"] == "2" and env["PATH"] == "/bin"

    def test_command_and_args_are_expanded_against_the_environment(self) -> None:
        container = pod([c("a", command=["serve"], args=["--host", "$(POD_IP)"])]).spec.containers[0]
        assert envs.command_line(container, {"POD_IP": "127.64.1.7"}) == ["serve", "--host", "127.64.1.7"]

    def test_missing_config_map_key_is_a_config_error_naming_it(self) -> None:
        ref = {"configMapKeyRef": {"name": "cfg", "key": "k"}}
        container = pod([c("a", env=[{"name": "X", "valueFrom": ref}])]).spec.containers[0]
        with pytest.raises(envs.ContainerConfigError, match='configmap "cfg" not found'):
            envs.container_env(container, facts(), {"configmap/cfg": None}, {})
        with pytest.raises(envs.ContainerConfigError, match='couldn\'t find key k in configmap "cfg"'):
            envs.container_env(container, facts(), {"configmap/cfg": {"other": "v"}}, {})

    def test_a_container_without_command_cannot_run_here(self) -> None:
        container = pod([{"name": "a", "image": "nginx"}]).spec.containers[0]
        with pytest.raises(envs.ContainerConfigError, match="pulls no images"):
            envs.command_line(container, {})


class TestMounts:
    def test_volumes_map_to_pod_directories_and_sub_path_expr_is_expanded(self) -> None:
        p = pod(
            [
                c(
                    "a",
                    volumeMounts=[
                        {"name": "cfg", "mountPath": "/etc/strata"},
                        {"name": "shm", "mountPath": "/dev/shm"},
                        {"name": "nvme", "mountPath": "/var/cache/nvme", "subPathExpr": "$(NS)/$(NAME)"},
                    ],
                )
            ],
            volumes=[
                {"name": "cfg", "configMap": {"name": "c"}},
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                {"name": "nvme", "hostPath": {"path": "/var/lib/x", "type": "DirectoryOrCreate"}},
            ],
        )
        dirs = PodDirs(Path("/r/pods/key"), Path("/l/key"))
        mounts = container_mounts(p, p.spec.containers[0], dirs, {"NS": "ns", "NAME": "p"}, {})
        assert mounts == [
            Mount("/r/pods/key/volumes/cfg", "/etc/strata", read_only=True),
            Mount("/r/pods/key/volumes/shm", "/dev/shm", read_only=False),
            Mount("/var/lib/x/ns/p", "/var/cache/nvme", read_only=False, make_source=True),
        ]

    def test_sub_path_may_not_leave_the_volume(self) -> None:
        p = pod(
            [c("a", volumeMounts=[{"name": "v", "mountPath": "/x", "subPath": "../etc"}])],
            volumes=[{"name": "v", "emptyDir": {}}],
        )
        with pytest.raises(envs.ContainerConfigError, match="subPath"):
            container_mounts(p, p.spec.containers[0], PodDirs(Path("/r"), Path("/l")), {}, {})


class TestPodAddresses:
    def test_lowest_free_address_skipping_the_gateway(self) -> None:
        assert network.pick_ip("127.64.3.0/24", set()) == "127.64.3.2"
        assert network.pick_ip("127.64.3.0/24", {"127.64.3.2", "127.64.3.4"}) == "127.64.3.3"

    def test_a_full_range_says_so(self) -> None:
        with pytest.raises(network.RangeExhaustedError, match=r"127\.64\.3\.0/30"):
            network.pick_ip("127.64.3.0/30", {"127.64.3.2"})


class TestProbeThresholds:
    def test_readiness_needs_success_threshold_and_drops_at_failure_threshold(self) -> None:
        probe = pod(
            [
                c(
                    "a",
                    readinessProbe={"exec": {"command": ["x"]}, "successThreshold": 2, "failureThreshold": 3},
                )
            ]
        )
        spec = probe.spec.containers[0].readiness_probe
        assert spec is not None
        state = probes.tracker("readiness", spec)
        results = []
        for ok in (True, True, False, False, True, False, False, False):
            state = probes.observe(state, ok)
            results.append(state.result)
        assert results == [False, True, True, True, True, True, True, False]

    def test_liveness_starts_alive(self) -> None:
        probe = pod([c("a", livenessProbe={"tcpSocket": {"port": 1}})]).spec.containers[0].liveness_probe
        assert probe is not None and probes.tracker("liveness", probe).result is True


class TestCpuShortage:
    def test_the_scheduler_counts_sidecars_with_main_containers_and_the_largest_init_alone(self) -> None:
        need = {"resources": {"requests": {"cpu": "500m"}}}
        p = pod(
            [c("a", **need), c("b", **need)],
            init=[c("i", resources={"requests": {"cpu": "3"}}), c("s", restartPolicy="Always", **need)],
        )
        assert capacity.pod_cpu(p) == 3.0
        q = pod([c("a", **need)], init=[c("s", restartPolicy="Always", **need)])
        assert capacity.pod_cpu(q) == 1.0

    def test_a_local_pod_short_of_cpu_is_told_what_to_do(self) -> None:
        wanting = pod([c("a", resources={"requests": {"cpu": "4"}})], tolerations=[LOCAL_TOLERATION])
        unschedulable = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/5 nodes are available: 1 Insufficient cpu.",
            }
        ]
        message = capacity.shortage_message(wanting, unschedulable, offered=2, taken=1.5, machine_cpus=2)
        assert message is not None
        assert "offer 2 CPU in all (this machine has 2)" in message and "request 1.5, this pod 4" in message
        assert "local_node_cpu" in message

    def test_other_pending_pods_are_not_its_business(self) -> None:
        kwok_pod = pod([c("a")])
        unschedulable = [{"type": "PodScheduled", "reason": "Unschedulable", "message": "Insufficient cpu"}]
        assert capacity.shortage_message(kwok_pod, unschedulable, 2, 0, 2) is None
        local = pod([c("a")], tolerations=[LOCAL_TOLERATION])
        gpus = [{"type": "PodScheduled", "reason": "Unschedulable", "message": "Insufficient nvidia.com/gpu"}]
        assert capacity.shortage_message(local, gpus, 2, 0, 2) is None


class TestPodRanges:
    def test_two_clusters_never_share_a_range_and_a_released_one_is_reused(self, tmp_path: Path) -> None:
        first = ranges.reserve(tmp_path)
        second = ranges.reserve(tmp_path)
        assert (first.cidr, second.cidr) == ("127.64.0.0/16", "127.65.0.0/16")
        first.release()
        third = ranges.reserve(tmp_path)
        assert third.cidr == "127.64.0.0/16"
        second.release()
        third.release()

    def test_a_full_pool_says_so(self, tmp_path: Path) -> None:
        held = [ranges.reserve(tmp_path, pool="127.64.0.0/15") for _ in range(2)]
        with pytest.raises(ranges.NoFreeRangeError, match="all 2 pod ranges"):
            ranges.reserve(tmp_path, pool="127.64.0.0/15")
        for lock in held:
            lock.release()
