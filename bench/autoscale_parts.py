"""Running the ``autoscale`` benchmark's tasks within a time budget, several at once, each in a
process of its own, keeping every finished task's figures as a *part*
(bench/results/autoscale-parts/<key>.json, with the fingerprint of the code it ran).

A part whose fingerprint matches the code's is reused, so a benchmark cut short by its budget
(``STRATA_BENCH_AUTOSCALE_BUDGET_S``, default 2 h) goes on where it stopped when run again; a
task still running when the budget is spent is stopped and named in the result's ``not_run``,
with a message saying how to finish. ``STRATA_BENCH_JOBS`` sets how many tasks run at once
(default: the CPUs this process may use).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from multiprocessing.context import SpawnProcess
from pathlib import Path
from typing import Any

from bench.autoscale_scenario import Task, fingerprint

PARTS = Path(__file__).parent / "results" / "autoscale-parts"
BUDGET_S = float(os.environ.get("STRATA_BENCH_AUTOSCALE_BUDGET_S", 7200))
POLL_S = 1.0
Log = Callable[[str], None]


def part_path(key: str, parts: Path = PARTS) -> Path:
    return parts / (key.replace("/", "--").replace(" ", "_") + ".json")


def load(key: str, stamp: str, parts: Path = PARTS) -> dict[str, Any] | None:
    """A stored part, when it was computed by this code."""
    path = part_path(key, parts)
    if not path.exists():
        return None
    stored = json.loads(path.read_text())
    figures: dict[str, Any] | None = stored["figures"] if stored.get("fingerprint") == stamp else None
    return figures


def run_all(
    tasks: Sequence[Task],
    budget_s: float = BUDGET_S,
    jobs: int | None = None,
    parts: Path = PARTS,
    log: Log = print,
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Every task's figures (reused or computed), and the keys of those not run in the budget."""
    stamps = {t.code: fingerprint(*t.code) for t in tasks}
    done = {t.key: f for t in tasks if (f := load(t.key, stamps[t.code], parts)) is not None}
    pending = [t for t in tasks if t.key not in done]
    if done:
        reused = f"{len(done)} of {len(tasks)} tasks reused from {parts}"
        log(f"autoscale: {reused} (fingerprints {sorted(set(stamps.values()))})")
    jobs = jobs or int(os.environ.get("STRATA_BENCH_JOBS", 0)) or len(os.sched_getaffinity(0))
    running: dict[str, tuple[SpawnProcess, float, str]] = {}
    deadline = time.monotonic() + budget_s
    context = multiprocessing.get_context("spawn")
    stop = signal.signal(signal.SIGTERM, _exit)  # a terminated benchmark stops its tasks too
    try:
        pending = _loop(pending, done, running, deadline, jobs, (context, stamps, parts, log))
    finally:
        signal.signal(signal.SIGTERM, stop)
        for process, _started, _stamp in running.values():
            process.terminate()
            process.join()
    not_run = sorted([*running, *(t.key for t in pending)])
    not_run += sorted({t.key for t in tasks} - set(done) - set(not_run))
    return done, not_run


def _exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _loop(
    pending: list[Task],
    done: dict[str, dict[str, Any]],
    running: dict[str, tuple[SpawnProcess, float, str]],
    deadline: float,
    jobs: int,
    how: tuple[Any, dict[tuple[bool, tuple[str, ...]], str], Path, Log],
) -> list[Task]:
    """Start, watch and collect tasks until none is left or the deadline passes; returns the
    tasks not started (``running`` keeps those still running)."""
    context, stamps, parts, log = how
    while (pending or running) and time.monotonic() < deadline:
        for task in _startable(pending, done, running, jobs):
            needs = {key: done[key] for key in task.after}
            stamp = stamps[task.code]
            process = context.Process(target=_child, args=(task, needs, stamp, parts), name=task.key)
            process.start()
            running[task.key] = (process, time.monotonic(), stamp)
            pending.remove(task)
            log(f"autoscale: {task.key} started")
        time.sleep(POLL_S)
        for key, (process, started, stamp) in list(running.items()):
            if process.is_alive():
                continue
            process.join()
            del running[key]
            figures = load(key, stamp, parts)
            if figures is None:
                log(f"autoscale: {key} FAILED (exit code {process.exitcode}); see the output above")
                pending = [t for t in pending if key not in t.after]  # what needed it cannot run
                continue
            done[key] = figures
            log(f"autoscale: {key} done in {time.monotonic() - started:.0f} s")
    return pending


def _startable(
    pending: Sequence[Task], done: dict[str, Any], running: dict[str, Any], jobs: int
) -> list[Task]:
    free = jobs - len(running)
    ready = [t for t in pending if all(a in done for a in t.after)]
    return ready[: max(0, free)]


def _child(task: Task, needs: dict[str, dict[str, Any]], stamp: str, parts: Path) -> None:
    signal.signal(signal.SIGTERM, _exit)  # stopped at the budget: its own processes go with it
    figures = task.run(needs)
    parts.mkdir(parents=True, exist_ok=True)
    path = part_path(task.key, parts)
    temporary = path.with_suffix(".tmp")
    stored = {"key": task.key, "fingerprint": stamp, "figures": figures}
    temporary.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    temporary.replace(path)
    sys.stdout.flush()
