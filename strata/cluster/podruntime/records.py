"""What the runtime knows about each container, as immutable records and pure transitions.

The pod worker owns one record per container and replaces it on every event (started, exited,
probe result); every decision (``decide``) is a function of these records and the clock.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# The kubelet's restart back-off: the first restart is immediate, then 10 s, doubling to 5 min;
# a container that has not crashed for twice the cap starts over.
BACKOFF_INITIAL_S = 10.0
BACKOFF_MAX_S = 300.0
BACKOFF_RESET_S = 2 * BACKOFF_MAX_S
SIGKILL_EXIT = 137


@dataclass(frozen=True)
class Exit:
    code: int
    reason: str  # Completed, Error, OOMKilled, StartError, ContainerStatusUnknown
    started_at: float
    finished_at: float
    message: str = ""


@dataclass(frozen=True)
class ContainerRecord:
    name: str
    restarts: int = 0
    running_since: float | None = None
    exit: Exit | None = None  # the terminated state while not running
    last_exit: Exit | None = None  # the kubelet's lastState
    started: bool = False  # startup probe passed (or none), and postStart done
    ready: bool = False
    waiting_reason: str = ""  # why it could not be created (CreateContainerConfigError)
    waiting_message: str = ""
    backoff_s: float = 0.0  # the delay the next crash waits (0: the next restart is immediate)
    backoff_until: float = 0.0  # no start before this
    last_exit_at: float | None = None
    starts: int = 0  # processes started in this runtime's life (logs are numbered by it)

    @property
    def running(self) -> bool:
        return self.running_since is not None

    @property
    def ever_ran(self) -> bool:
        return self.running or self.exit is not None


def started(record: ContainerRecord, now: float, has_startup_gate: bool) -> ContainerRecord:
    """A process for the container is running; it counts as started at once without a gate."""
    restarts = record.restarts + (1 if record.ever_ran else 0)
    last = record.exit if record.exit is not None else record.last_exit
    return dataclasses.replace(
        record,
        restarts=restarts,
        running_since=now,
        exit=None,
        last_exit=last,
        started=not has_startup_gate,
        ready=False,
        waiting_reason="",
        waiting_message="",
        starts=record.starts + 1,
    )


def exited(record: ContainerRecord, code: int, reason: str, now: float, message: str = "") -> ContainerRecord:
    """The process ended; the back-off for a restart is computed here, once per exit."""
    since = record.running_since if record.running_since is not None else now
    expired = record.last_exit_at is None or now - record.last_exit_at > BACKOFF_RESET_S
    delay = 0.0 if expired or record.backoff_s == 0 else record.backoff_s
    grown = BACKOFF_INITIAL_S if delay == 0 else min(2 * delay, BACKOFF_MAX_S)
    return dataclasses.replace(
        record,
        running_since=None,
        exit=Exit(code, reason, since, now, message),
        started=False,
        ready=False,
        backoff_s=grown,
        backoff_until=now + delay,
        last_exit_at=now,
    )


def exit_reason(code: int) -> str:
    return "Completed" if code == 0 else "Error"


def start_failed(record: ContainerRecord, reason: str, message: str, now: float) -> ContainerRecord:
    """The container could not be created (bad env reference, missing command...): it waits,
    and is retried with the same back-off as a crash."""
    waited = exited(record, 128, "StartError", now, message)
    return dataclasses.replace(waited, exit=record.exit, waiting_reason=reason, waiting_message=message)


def probed(record: ContainerRecord, kind: str, ok: bool) -> ContainerRecord:
    if not record.running:
        return record
    if kind == "startup":
        return dataclasses.replace(record, started=ok or record.started)
    if kind == "readiness":
        return dataclasses.replace(record, ready=ok and record.started)
    return record


def adopted_from_status(name: str, status: dict[str, Any] | None, now: float) -> ContainerRecord:
    """A record carried over from the status a previous runtime wrote: the restart count goes on,
    a container that had finished stays finished, and one that was running is gone (its processes
    died with that runtime), as after a node restart."""
    record = ContainerRecord(name=name)
    if not status:
        return record
    record = dataclasses.replace(record, restarts=int(status.get("restartCount", 0)))
    state = status.get("state") or {}
    if "running" in state:
        message = "The container could not be located when the pod runtime restarted"
        return dataclasses.replace(
            record, exit=Exit(SIGKILL_EXIT, "ContainerStatusUnknown", now, now, message)
        )
    if "terminated" in state:
        done = state["terminated"]
        code = int(done.get("exitCode", 0))
        return dataclasses.replace(record, exit=Exit(code, done.get("reason") or exit_reason(code), now, now))
    return record
