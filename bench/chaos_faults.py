"""The faults the chaos benchmark injects, one function each: it breaks something and returns
at once (what undoes a fault the platform is not expected to undo itself, such as a full
volume, comes back as ``Injected.undo``, run after the row's measurement). Every fault touches
the first worker pod (or router pod) by name order, so a run is repeatable.

- ``engine``, ``sidecar``, ``router``: SIGKILL to the container's own process; the pod runtime
  restarts it by the pod's restartPolicy.
- ``pod-delete``: ``kubectl delete pod`` of a worker; its workload makes another.
- ``operator-scale-up``: the service pinned at one more replica, the operator SIGKILLed a second
  later, in the middle of its reaction, and a new operator started: it must finish the scale-up.
- ``apiserver``, ``etcd``: the component stopped and started again with its own command line.
- ``nvme-full``: a ballast file takes every free byte of the NVMe volume (ENOSPC for the tier's
  writes); removed after the row.
- ``shm-full``: the same in the worker pod's memory-backed /dev/shm volume.
- ``nvme-corrupt``: bytes inside every written slot of the worker's NVMe data file overwritten,
  then the pod deleted, so its successor finds the corrupted blocks in its recovered index; once
  it is Ready the other worker deleted, so that the successor is asked for those blocks.
- ``slow-disk``: 50 ms added to each read, write and sync the sidecar makes (strace's syscall
  delay injection, no FUSE, no kernel module); detached after the row.
- ``burst``: 1,000 requests at once through the Service's ClusterIP.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench import chaos_load
from bench.chaos_outcome import Response
from bench.chaos_platform import Platform, wait_healthy, wait_unhealthy
from strata import stack

BURST = 1000
SLOW_IO_US = 50_000
SLOW_SYSCALLS = "pread64,pwrite64,preadv,pwritev,preadv2,pwritev2,fsync,fdatasync"
CORRUPT_BYTES = 256
CORRUPT_SLOTS = 4096
BALLAST = "chaos-ballast"
OPERATOR_KILL_AFTER_S = 1.0
SUCCESSOR_S = 600.0
FRESH_PREFIXES, FRESH_SENDS, FRESH_SEED = 16, 3, 100


@dataclass
class Injected:
    undo: Callable[[], None] = lambda: None
    responses: list[Response] = field(default_factory=list)  # the fault's own requests (a burst)
    note: str = ""
    # Whether the platform should be seen unhealthy first (a kill, a restart): its recovery is
    # timed from there, not from a look taken before the runtime noticed.
    disrupts: bool = True


Fault = Callable[[Platform, float], Injected]


def first(pods: list[dict[str, object]]) -> str:
    if not pods:
        raise RuntimeError("chaos: no pod to break")
    return str(pods[0]["metadata"]["name"])  # type: ignore[index]


def kill_container(platform: Platform, pod: str, container: str) -> None:
    os.kill(platform.container_pid(pod, container), signal.SIGKILL)


def engine(platform: Platform, t0: float) -> Injected:
    kill_container(platform, first(platform.workers()), "engine")
    return Injected()


def sidecar(platform: Platform, t0: float) -> Injected:
    kill_container(platform, first(platform.workers()), "kvtier")
    return Injected()


def router(platform: Platform, t0: float) -> Injected:
    kill_container(platform, first(platform.routers()), "router")
    return Injected()


def pod_delete(platform: Platform, t0: float) -> Injected:
    name = first(platform.workers())
    platform.cluster.kubectl("delete", "pod", name, "-n", platform.namespace, "--wait=false")
    return Injected()


def operator_scale_up(platform: Platform, t0: float) -> Injected:
    platform.scale(platform.replicas + 1)
    time.sleep(OPERATOR_KILL_AFTER_S)  # in the middle of its reaction to the new spec
    platform.operator.kill()
    platform.operator = stack.OperatorProcess(
        platform.operator.kubeconfig, platform.operator.log, env=platform.operator.env
    ).start()
    return Injected(undo=lambda: platform.scale(platform.replicas - 1))


def apiserver(platform: Platform, t0: float) -> Injected:
    platform.cluster.restart_component("kube-apiserver")
    return Injected()


def etcd(platform: Platform, t0: float) -> Injected:
    platform.cluster.restart_component("etcd")
    return Injected()


def fill(directory: Path) -> Callable[[], None]:
    """A ballast file taking every free byte under ``directory``; what removes it."""
    ballast = directory / BALLAST
    room = os.statvfs(directory)
    size = room.f_bavail * room.f_frsize
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, max(size, 1))
    except OSError:  # a racing writer took some: keep what was allocated, full either way
        pass
    finally:
        os.close(fd)
    return lambda: ballast.unlink(missing_ok=True)


def nvme_full(platform: Platform, t0: float) -> Injected:
    """The volume filled, then new prompts, a few times each: their blocks are written through
    to NVMe, and its log finds no room."""
    if not platform.nvme_is_mount:
        raise Skipped("the NVMe volume is not a mount of its own here (needs root): not filling the disk")
    undo = fill(platform.nvme)
    responses = asyncio.run(_fresh(platform.url(), t0))
    return Injected(undo=undo, responses=responses, disrupts=False)


async def _fresh(url: str, t0: float) -> list[Response]:
    pool = chaos_load.prompt_pool()
    fresh = chaos_load.prompt_pool(prefixes=FRESH_PREFIXES, per_prefix=1, seed=FRESH_SEED)
    both = [*pool, *fresh]  # indices past the pool's have no reference answer: not compared
    async with chaos_load.new_client(4) as client:
        return [
            await chaos_load.send(client, url, both, len(pool) + i, t0)
            for _ in range(FRESH_SENDS)
            for i in range(len(fresh))
        ]


def shm_full(platform: Platform, t0: float) -> Injected:
    pid = platform.container_pid(first(platform.workers()), "kvtier")
    return Injected(undo=fill(Path(f"/proc/{pid}/root/dev/shm")), disrupts=False)


def data_files(platform: Platform, pod: str) -> list[Path]:
    """The pod's NVMe data files (the hostPath volume's ``<namespace>/<pod>`` subdirectory)."""
    return sorted((platform.nvme / platform.namespace / pod).rglob("blocks.dat"))


def corrupt(path: Path, block_bytes: int, slot_bytes: int, slots: int) -> int:
    """Invert bytes in the middle of the block in each of the first ``slots`` slots (the tier
    fills its slots from the start); how many slots it changed."""
    changed = 0
    with path.open("r+b") as data:
        for slot in range(slots):
            offset = slot * slot_bytes + block_bytes // 2
            data.seek(offset)
            old = data.read(CORRUPT_BYTES)
            if len(old) < CORRUPT_BYTES:
                break
            data.seek(offset)
            data.write(bytes(b ^ 0xFF for b in old))
            changed += 1
        data.flush()
        os.fsync(data.fileno())
    return changed


def nvme_corrupt(platform: Platform, t0: float) -> Injected:
    """The first worker's NVMe blocks corrupted and the pod deleted; once its successor (which
    recovers the corrupted index) is Ready, the other worker deleted, so that the prefixes it
    served come to the successor, which reads them from NVMe."""
    workers = platform.workers()
    name, other = first(workers), str(workers[-1]["metadata"]["name"])
    files = data_files(platform, name)
    if not files:
        raise RuntimeError(f"chaos: no NVMe data file of {name} under {platform.nvme}")
    changed = 0
    for path in files:
        meta = json.loads((path.parent / "meta.json").read_text())
        changed += corrupt(path, int(meta["block_bytes"]), int(meta["slot_bytes"]), CORRUPT_SLOTS)
    platform.cluster.kubectl("delete", "pod", name, "-n", platform.namespace, "--wait=false")
    wait_unhealthy(platform, SUCCESSOR_S)
    wait_healthy(platform, SUCCESSOR_S)
    platform.cluster.kubectl("delete", "pod", other, "-n", platform.namespace, "--wait=false")
    return Injected(note=f"{changed} slots corrupted in {name}'s NVMe file, {name} then {other} deleted")


def slow_disk(platform: Platform, t0: float) -> Injected:
    pid = platform.container_pid(first(platform.workers()), "kvtier")
    inject = f"inject={SLOW_SYSCALLS}:delay_enter={SLOW_IO_US}"
    argv = [
        "strace",
        "-f",
        "-qq",
        "-o",
        "/dev/null",
        "-p",
        str(pid),
        "-e",
        f"trace={SLOW_SYSCALLS}",
        "-e",
        inject,
    ]
    tracer = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)
    if tracer.poll() is not None:
        raise RuntimeError(f"chaos: strace exited with {tracer.returncode}; cannot slow the disk")
    return Injected(undo=lambda: _stop(tracer), disrupts=False)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGINT)  # strace detaches on SIGINT, leaving the tracee running
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def burst(platform: Platform, t0: float) -> Injected:
    responses = asyncio.run(chaos_load.burst(platform.url(), chaos_load.prompt_pool(), BURST, t0))
    return Injected(responses=responses, disrupts=False)


def mixed(platform: Platform, t0: float) -> Injected:
    """Several at once, a few seconds apart: an engine, a router, the other worker pod, the API."""
    workers = platform.workers()
    kill_container(platform, first(workers), "engine")
    time.sleep(3)
    kill_container(platform, first(platform.routers()), "router")
    time.sleep(3)
    other = str(workers[-1]["metadata"]["name"])
    platform.cluster.kubectl("delete", "pod", other, "-n", platform.namespace, "--wait=false")
    time.sleep(3)
    platform.cluster.restart_component("kube-apiserver")
    return Injected()


class Skipped(Exception):
    """A fault this machine cannot inject; the message says why."""


FAULTS: dict[str, Fault] = {
    "engine": engine,
    "sidecar": sidecar,
    "router": router,
    "pod-delete": pod_delete,
    "operator-scale-up": operator_scale_up,
    "apiserver": apiserver,
    "etcd": etcd,
    "nvme-full": nvme_full,
    "shm-full": shm_full,
    "nvme-corrupt": nvme_corrupt,
    "slow-disk": slow_disk,
    "burst": burst,
    "mixed": mixed,
}
