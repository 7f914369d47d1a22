"""Ctrl-C while the demo runs stops everything it started: the detached operator, the control
plane, its pod runtime and the containers it runs (the walk-through pod's worker and sidecar).
Interrupted as step 5 begins, once that pod runs for real: the cheapest point where every kind
of process is running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from strata.stack.wait import WaitTimeout, wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(1800)]
# The control plane, the chart, the operator and a Ready service, whose pod imports torch: minutes
# on a loaded two-core machine.
STARTED_WITHIN_S = 1200.0
STOPPED_WITHIN_S = 300.0


def processes_of(directory: Path) -> list[str]:
    """Command lines of the live processes that name the demo's directory (every process the
    demo and its cluster start has a path under it in its arguments)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue  # gone meanwhile, or not a process
        if str(directory) in argv and entry.name != str(os.getpid()):
            found.append(f"{entry.name}: {argv}")
    return found


def short(processes: list[str]) -> list[str]:
    return [p[:200] for p in processes]


def _default_sigint() -> None:
    """Ctrl-C's default for the demo: a test run in the background of a shell has SIGINT
    ignored, which a child inherits, and Python then raises no KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_everything_the_demo_started(tmp_path: Path) -> None:
    directory = (tmp_path / "demo").resolve()
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        # Its own process group, which a terminal's Ctrl-C reaches as a whole.
        demo = subprocess.Popen(
            [sys.executable, "-m", "strata", "demo", "--dir", str(directory)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_default_sigint,
        )
    try:
        wait_for(lambda: "=== 5/7" in log.read_text() or demo.poll() is not None, STARTED_WITHIN_S, "step 5")
        assert demo.poll() is None, log.read_text()[-3000:]
        running = processes_of(directory)
        assert running, "nothing of the demo's runs: the check below would prove nothing"
        # The walk-through pod's containers run (their shims name the pod runtime's state there).
        for container in ("engine", "kvtier"):
            shim = "tenant-a_chat-0_"
            assert any(shim in p and f"/{container}.launch.json" in p for p in running), short(running)
        os.killpg(demo.pid, signal.SIGINT)
        assert demo.wait(STOPPED_WITHIN_S) == 130, log.read_text()[-3000:]
    finally:
        if demo.poll() is None:  # the test failed before the interrupt: leave nothing behind
            # The demo first, or it goes on starting things (Prometheus) after `down` has run.
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
            subprocess.run(
                [sys.executable, "-m", "strata", "demo", "down", "--dir", str(directory)], check=False
            )
    assert "interrupted; stopping everything it started" in log.read_text()
    try:
        wait_for(lambda: not processes_of(directory), STOPPED_WITHIN_S, "the demo's processes to go")
    except WaitTimeout:
        pytest.fail(f"left behind after Ctrl-C: {short(processes_of(directory))}")
