"""One pod on this runtime: its containers' processes, probes, status and deletion.

A single asyncio task per pod runs ``sync`` whenever something happens (a container exited, a
probe flipped, the pod object changed, a back-off ended) and applies ``decide.plan``; container
tasks (exit watcher, probe loops) only update records and wake it. Deletion follows the
kubelet: preStop hooks, SIGTERM to main containers, then sidecars in reverse order, SIGKILL at
the end of the grace period, the final status, then the pod object is deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import time
from pathlib import Path
from typing import Any

from strata.cluster.podruntime import decide, events, processes, records, services, volumes
from strata.cluster.podruntime import env as envs
from strata.cluster.podruntime import probes as probing
from strata.cluster.podruntime.endpoints import PodEndpoint
from strata.cluster.podruntime.host import HOST_IP, MIN_GRACE_S, Host, Node
from strata.cluster.podruntime.images import ImageUnavailable
from strata.cluster.podruntime.mounts import Mount, PodDirs, container_mounts, environment_mounts, image_mount
from strata.cluster.podruntime.spec import Container, Pod, Probe, parse_pod
from strata.cluster.podruntime.status import Addresses, container_statuses, pod_status
from strata.operator.kube import STRATEGIC_MERGE_PATCH, KubeError

log = logging.getLogger(__name__)
VOLUME_RETRY_S = 2.0
STATUS_RETRY_S = 1.0


class PodWorker:
    def __init__(self, host: Host, node: Node, obj: dict[str, Any], pod_ip: str) -> None:
        self.host, self.node = host, node
        self.pod = parse_pod(obj)
        self.existing: list[dict[str, Any]] = (obj.get("status") or {}).get("conditions") or []
        now = time.time()
        self.records = _adopted_records(self.pod, obj.get("status") or {}, now)
        self.addresses = Addresses(pod_ip, HOST_IP, now)
        self.dirs = PodDirs(host.pods / self.pod.key, host.logs / self.pod.key)
        self.shims: dict[str, processes.Shim] = {}
        self.envs: dict[str, dict[str, str]] = {}
        self.tasks: dict[str, list[asyncio.Task[None]]] = {}
        self.claims: dict[str, Any] | None = None
        self.wake = asyncio.Event()
        self.deleted = False
        self.written: dict[str, Any] | None = None
        self.token_due: float | None = None

    # -- inputs from the node's watch ----------------------------------------------------------
    def update(self, obj: dict[str, Any]) -> None:
        self.pod = parse_pod(obj)
        self.existing = (obj.get("status") or {}).get("conditions") or []
        self.wake.set()

    def endpoint(self) -> PodEndpoint:
        """This pod as a Service endpoint: Ready as last reported to the API server."""
        conditions = (self.written or {}).get("conditions") or []
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)
        meta = self.pod.metadata
        return PodEndpoint(
            meta.namespace,
            meta.labels,
            self.addresses.pod_ip,
            ready,
            self.pod.terminating or self.deleted,
            self.pod.named_tcp_ports(),
        )

    def forget(self) -> None:
        """The pod object is gone (force-deleted): stop its containers at once."""
        self.deleted = True
        self.wake.set()

    # -- the pod's life ------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            while not (self.pod.terminating or self.deleted):
                wake_at = await self.sync(time.time())
                await self._sleep(wake_at)
            await self.terminate(self._grace_s())
            if not self.deleted:
                await self._delete_object()
        finally:
            self._cancel_tasks()
            volumes.release(self.dirs)

    async def shutdown(self, grace_s: float) -> None:
        """The runtime is stopping: stop the containers, leave the pod object as it is."""
        self.deleted = True
        await self.terminate(grace_s, write_status=False)
        self._cancel_tasks()

    async def sync(self, now: float) -> float | None:
        if self.claims is None and not await self._prepare_volumes():
            return now + VOLUME_RETRY_S
        if self.token_due is not None and now >= self.token_due:
            await self._refresh_tokens(now)
        step = decide.plan(self.pod, self.records, now)
        for name in step.start:
            await self._start(self.pod.container(name), time.time())
        if decide.main_containers_finished(self.pod, self.records):
            await self._stop_sidecars()
        wrote = await self._write_status()
        wakes = [t for t in (step.wake_at, self.token_due, None if wrote else now + STATUS_RETRY_S) if t]
        return min(wakes, default=None)

    async def _sleep(self, wake_at: float | None) -> None:
        timeout = None if wake_at is None else max(wake_at - time.time(), 0.0)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.wake.wait(), timeout)
        self.wake.clear()

    def _grace_s(self) -> float:
        grace = self.pod.metadata.deletion_grace_period_seconds
        seconds = self.pod.spec.termination_grace_period_seconds if grace is None else grace
        return max(float(seconds), MIN_GRACE_S)

    # -- volumes -------------------------------------------------------------------------------
    def _facts(self) -> envs.PodFacts:
        return envs.PodFacts(self.pod, self.addresses.pod_ip, self.addresses.host_ip, self.node.allocatable)

    def _volume_context(self) -> volumes.VolumeContext:
        return volumes.VolumeContext(self.host.api, self._facts(), self.dirs, self.host.claims)

    async def _prepare_volumes(self) -> bool:
        try:
            self.claims = await volumes.prepare_all(self._volume_context())
        except (volumes.VolumeError, envs.ContainerConfigError, KubeError) as error:
            await self._event("FailedMount", f"MountVolume.SetUp failed: {error}", warning=True)
            return False
        refresh = volumes.token_refresh_s(self.pod)
        self.token_due = time.time() + refresh if refresh else None
        return True

    async def _refresh_tokens(self, now: float) -> None:
        context = self._volume_context()
        for volume in self.pod.spec.volumes:
            if volume.projected is not None:
                with contextlib.suppress(volumes.VolumeError, KubeError):
                    await volumes.prepare(context, volume)
        refresh = volumes.token_refresh_s(self.pod)
        self.token_due = now + refresh if refresh else None

    # -- starting containers -------------------------------------------------------------------
    async def _sources(self, container: Container) -> envs.Sources:
        found: dict[str, dict[str, str] | None] = {}
        for kind, name in envs.referenced_sources(container):
            plural = "configmaps" if kind == "configmap" else "secrets"
            obj = await self.host.api.read_path(
                f"/api/v1/namespaces/{self.pod.metadata.namespace}/{plural}/{name}"
            )
            found[f"{kind}/{name}"] = None if obj is None else _string_data(obj, kind == "secret")
        return found

    async def _service_env(self) -> dict[str, str]:
        """The Service links of the pod's namespace as they are now (enableServiceLinks)."""
        if not self.pod.spec.enable_service_links:
            return {}
        namespace = self.pod.metadata.namespace
        listed = await self.host.api.request("GET", f"/api/v1/namespaces/{namespace}/services")
        return services.service_env(map(services.parse_service, listed.get("items", [])), namespace)

    async def _start(self, container: Container, now: float) -> None:
        name, record = container.name, self.records[container.name]
        try:
            image_env = self.host.images.env(container.image)
            base = {**await self._service_env(), **image_env, "HOSTNAME": self.pod.metadata.name}
            env = envs.container_env(container, self._facts(), await self._sources(container), base)
            argv = envs.command_line(container, env)
            mounts = [
                image_mount(str(self.host.repo_root)),
                *container_mounts(self.pod, container, self.dirs, env, self.claims or {}),
                *environment_mounts(self.host.images.directories(container.image)),
            ]
            _make_sub_paths(mounts)
        except (envs.ContainerConfigError, ImageUnavailable, KubeError, KeyError, OSError) as error:
            self.records[name] = records.start_failed(record, "CreateContainerConfigError", str(error), now)
            await self._event("Failed", f"Error: {error}", container=name, warning=True)
            return
        log_path = self.dirs.log(name, record.restarts + (1 if record.ever_ran else 0))
        shim = await processes.start(
            name,
            argv,
            env,
            mounts,
            state_dir=self.dirs.root / "containers",
            log=log_path,
            hostname=self.pod.metadata.name,
            cwd=container.working_dir or "/",
            read_only_root=container.security_context.read_only_root_filesystem,
        )
        gated = container.startup_probe is not None
        self.records[name] = records.started(record, now, has_startup_gate=gated)
        self.shims[name], self.envs[name] = shim, env
        if shim.process.returncode is not None:  # its command could not start: never running
            await self._watch(container, shim)
            return
        self.tasks[name] = [asyncio.create_task(self._watch(container, shim))]
        if not gated:
            self._after_startup(container)
        else:
            self._probe(container, "startup", container.startup_probe)
        await self._event("Started", f"Started container {name}", container=name)

    def _after_startup(self, container: Container) -> None:
        if container.readiness_probe is None:
            self.records[container.name] = dataclasses.replace(self.records[container.name], ready=True)
        else:
            self._probe(container, "readiness", container.readiness_probe)
        if container.liveness_probe is not None:
            self._probe(container, "liveness", container.liveness_probe)
        self.wake.set()

    async def _watch(self, container: Container, shim: processes.Shim) -> None:
        code, message = await shim.wait()
        for task in self.tasks.pop(container.name, [])[1:]:
            task.cancel()
        self.shims.pop(container.name, None)
        reason = "StartError" if message else records.exit_reason(code)
        self.records[container.name] = records.exited(
            self.records[container.name], code, reason, time.time(), message
        )
        log.info("container %s/%s exited with %d", self.pod.key, container.name, code)
        self.wake.set()

    # -- probes --------------------------------------------------------------------------------
    def _probe(self, container: Container, kind: str, probe: Probe | None) -> None:
        if probe is None:
            return
        target = probing.ProbeTarget(
            container, self.addresses.pod_ip, self.host.session, self._exec_runner(container.name)
        )
        self.tasks.setdefault(container.name, []).append(
            asyncio.create_task(self._probe_loop(container, kind, probe, target))
        )

    def _exec_runner(self, name: str) -> probing.ExecRunner:
        async def run(command: tuple[str, ...], timeout_s: float) -> int:
            shim = self.shims.get(name)
            if shim is None:
                return 1
            return await processes.exec_in(
                shim, command, self.envs[name], timeout_s, self.dirs.root / "containers"
            )

        return run

    async def _probe_loop(
        self, container: Container, kind: str, probe: Probe, target: probing.ProbeTarget
    ) -> None:
        await asyncio.sleep(probe.initial_delay_seconds)
        state = probing.tracker(kind, probe)
        while True:
            if kind != "readiness" and (self.pod.terminating or self.deleted):
                return  # as the kubelet: a pod shutting down is not restarted for failing liveness
            ok = await probing.check(probe, target)
            new = probing.observe(state, ok)
            if not ok and new.failures == 1:
                await self._event(
                    "Unhealthy", f"{kind.capitalize()} probe failed", container=container.name, warning=True
                )
            if new.result != state.result:
                self.records[container.name] = records.probed(self.records[container.name], kind, new.result)
                self.wake.set()
            state = new
            if kind == "startup" and state.result:
                self._after_startup(container)
                return
            if kind != "readiness" and not ok and state.failures == state.failure_threshold:
                await self._event(
                    "Killing",
                    f"Container {container.name} failed {kind} probe, will be restarted",
                    container=container.name,
                )
                await self._stop(container.name, time.time() + self._grace_s())
                return
            await asyncio.sleep(probe.period_seconds)

    # -- stopping ------------------------------------------------------------------------------
    async def _stop(self, name: str, deadline: float) -> None:
        """preStop, SIGTERM, wait until ``deadline``, SIGKILL; returns once the process is gone."""
        shim = self.shims.get(name)
        if shim is None:
            return
        watcher = self.tasks.get(name, [None])[0]
        await self._pre_stop(self.pod.container(name), deadline)
        shim.signal(signal.SIGTERM)
        if watcher is not None:
            await asyncio.wait({watcher}, timeout=max(deadline - time.time(), 0.0))
        if name in self.shims:
            shim.signal(signal.SIGKILL)
            if watcher is not None:
                await asyncio.wait({watcher})

    async def _pre_stop(self, container: Container, deadline: float) -> None:
        hook = container.lifecycle.pre_stop if container.lifecycle is not None else None
        if hook is None:
            return
        budget = max(deadline - time.time(), 0.0)
        if hook.sleep is not None:
            await asyncio.sleep(min(float(hook.sleep.get("seconds", 0)), budget))
            return
        probe = Probe(
            http_get=hook.http_get,
            tcp_socket=hook.tcp_socket,
            exec=hook.exec,
            timeout_seconds=max(int(budget), 1),
        )
        target = probing.ProbeTarget(
            container, self.addresses.pod_ip, self.host.session, self._exec_runner(container.name)
        )
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(probing.check(probe, target), budget)

    async def _stop_sidecars(self) -> None:
        for container in reversed(self.pod.spec.init_containers):
            if container.is_sidecar and container.name in self.shims:
                await self._stop(container.name, time.time() + self._grace_s())

    async def terminate(self, grace_s: float, write_status: bool = True) -> None:
        deadline = time.time() + grace_s
        mains = [c.name for c in self.pod.spec.containers if c.name in self.shims]
        if mains:
            await self._event(
                "Killing", f"Stopping container{'s' if len(mains) > 1 else ''} {', '.join(mains)}"
            )
        await asyncio.gather(*(self._stop(name, deadline) for name in mains))
        for container in reversed(self.pod.spec.init_containers):
            if container.name in self.shims:
                await self._stop(container.name, max(deadline, time.time() + MIN_GRACE_S))
        if write_status:
            await self._write_status()

    async def _delete_object(self) -> None:
        meta = self.pod.metadata
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta.uid}}
        with contextlib.suppress(KubeError):
            await self.host.api.delete_path(f"/api/v1/namespaces/{meta.namespace}/pods/{meta.name}", body)

    def _cancel_tasks(self) -> None:
        for tasks in self.tasks.values():
            for task in tasks:
                task.cancel()
        for shim in list(self.shims.values()):
            shim.signal(signal.SIGKILL)

    # -- reporting -----------------------------------------------------------------------------
    async def _write_status(self) -> bool:
        status = pod_status(self.pod, self.records, self.addresses, self.existing, time.time())
        if status == self.written:
            return True
        meta = self.pod.metadata
        body = {"metadata": {"uid": meta.uid}, "status": status}
        try:
            await self.host.api.patch_path(
                f"/api/v1/namespaces/{meta.namespace}/pods/{meta.name}/status", body, STRATEGIC_MERGE_PATCH
            )
        except (TimeoutError, KubeError, OSError) as error:
            log.warning("status of %s not written: %s", self.pod.key, error)
            return False
        self.written = status
        return True

    async def _event(
        self, reason: str, message: str, container: str | None = None, warning: bool = False
    ) -> None:
        meta = self.pod.metadata
        ref = events.pod_ref(meta.namespace, meta.name, meta.uid, container)
        await events.emit(self.host.api, ref, reason, message, self.node.name, warning)


def _make_sub_paths(mounts: list[Mount]) -> None:
    for mount in mounts:
        if mount.make_source:
            Path(mount.source).mkdir(parents=True, exist_ok=True)


def _string_data(obj: dict[str, Any], secret: bool) -> dict[str, str]:
    import base64

    data = obj.get("data") or {}
    return {k: base64.b64decode(v).decode(errors="replace") if secret else v for k, v in data.items()}


def _adopted_records(pod: Pod, status: dict[str, Any], now: float) -> dict[str, records.ContainerRecord]:
    by_name = container_statuses(status)
    names = [c.name for c in (*pod.spec.init_containers, *pod.spec.containers)]
    return {name: records.adopted_from_status(name, by_name.get(name), now) for name in names}
