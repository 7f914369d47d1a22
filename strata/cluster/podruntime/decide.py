"""Pure decisions of the pod runtime: what to start next, the pod's phase and its conditions.

They follow the kubelet's rules: init containers one at a time, each to success; a native
sidecar (an init container with restartPolicy Always) must be started before the next init
container runs and is restarted whatever the pod's policy; main containers start together once
initialisation is done and restart by the pod's restartPolicy with back-off.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from strata.cluster.podruntime.records import ContainerRecord
from strata.cluster.podruntime.spec import Container, Pod, RestartPolicy

Records = Mapping[str, ContainerRecord]


@dataclass(frozen=True)
class Plan:
    start: tuple[str, ...] = ()  # containers to start now, in order
    wake_at: float | None = None  # the earliest back-off that ends: plan again then
    failed: bool = False  # an init container failed under restartPolicy Never


def should_restart(policy: RestartPolicy, container: Container, record: ContainerRecord) -> bool:
    """Whether an exited container is started again (sidecars always are)."""
    if record.exit is None or container.is_sidecar:
        return True
    if policy == "Always":
        return True
    return policy == "OnFailure" and record.exit.code != 0


def _due(record: ContainerRecord, now: float) -> bool:
    return record.backoff_until <= now


def _starts_or_waits(name: str, record: ContainerRecord, now: float) -> Plan:
    if _due(record, now):
        return Plan(start=(name,))
    return Plan(wake_at=record.backoff_until)


def _init_plan(pod: Pod, records: Records, now: float) -> Plan | None:
    """The next init step, or None once every init container is done (sidecars started)."""
    for container in pod.spec.init_containers:
        record = records[container.name]
        if container.is_sidecar:
            if record.running and record.started:
                continue
            return Plan() if record.running else _starts_or_waits(container.name, record, now)
        if record.exit is not None and record.exit.code == 0:
            continue
        if record.running:
            return Plan()
        if record.exit is not None and pod.spec.restart_policy == "Never":
            return Plan(failed=True)
        return _starts_or_waits(container.name, record, now)
    return None


def initialized(pod: Pod, records: Records) -> bool:
    """Every init container done, or main containers already ran (a sidecar crashing later, or
    containers lost with a restarted runtime, do not send the pod back to initialising)."""
    if any(records[c.name].ever_ran for c in pod.spec.containers):
        return True
    return _init_plan(pod, records, now=float("inf")) is None


def plan(pod: Pod, records: Records, now: float) -> Plan:
    """What to start now; nothing for a pod being deleted (``terminate`` takes over)."""
    if pod.terminating:
        return Plan()
    if not initialized(pod, records):
        return _init_plan(pod, records, now) or Plan()
    starts: list[str] = []
    wakes: list[float] = []
    sidecars = [c for c in pod.spec.init_containers if c.is_sidecar]
    restart_sidecars = not main_containers_finished(pod, records)
    for container in (*(sidecars if restart_sidecars else ()), *pod.spec.containers):
        record = records[container.name]
        if record.running or not should_restart(pod.spec.restart_policy, container, record):
            continue
        step = _starts_or_waits(container.name, record, now)
        starts += step.start
        wakes += [step.wake_at] if step.wake_at is not None else []
    return Plan(start=tuple(starts), wake_at=min(wakes, default=None))


def main_containers_finished(pod: Pod, records: Records) -> bool:
    """Every main container has exited for good: the pod is done and its sidecars may stop."""
    policy = pod.spec.restart_policy
    return all(
        records[c.name].exit is not None
        and not records[c.name].running
        and not should_restart(policy, c, records[c.name])
        for c in pod.spec.containers
    )


def phase(pod: Pod, records: Records) -> str:
    """The pod phase by the kubelet's rules (getPhase)."""
    if _init_failed(pod, records):
        return "Failed"
    if not initialized(pod, records):
        return "Pending"
    mains = [records[c.name] for c in pod.spec.containers]
    if any(not r.ever_ran for r in mains):
        return "Pending"
    if any(r.running for r in mains):
        return "Running"
    policy = pod.spec.restart_policy
    if policy == "Always":
        return "Running"
    if all(r.exit is not None and r.exit.code == 0 for r in mains):
        return "Succeeded"
    return "Failed" if policy == "Never" else "Running"


def _init_failed(pod: Pod, records: Records) -> bool:
    if pod.spec.restart_policy != "Never":
        return False
    for container in pod.spec.init_containers:
        exit_ = records[container.name].exit
        if not container.is_sidecar and exit_ is not None and exit_.code != 0:
            return True
    return False


def unready(pod: Pod, records: Records) -> list[str]:
    """Containers that keep the pod from being ready: main containers and sidecars."""
    sidecars = [c.name for c in pod.spec.init_containers if c.is_sidecar]
    names = [*sidecars, *(c.name for c in pod.spec.containers)]
    return [n for n in names if not records[n].ready]


def incomplete_init(pod: Pod, records: Records) -> list[str]:
    names = []
    for container in pod.spec.init_containers:
        record = records[container.name]
        done = record.started if container.is_sidecar else (record.exit is not None and record.exit.code == 0)
        if not done:
            names.append(container.name)
    return names
