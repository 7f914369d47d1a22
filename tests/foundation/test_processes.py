"""No process outlives the harness: group stop, graceful stop on exit and SIGTERM, kernel kill on SIGKILL."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from strata.cluster import processes
from strata.cluster.cli import pid_alive
from strata.cluster.supervisor import report_exited
from tests.foundation.waiting import WAIT_S


def wait_dead(pid: int, timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def wait_file(path: Path, timeout_s: float = WAIT_S) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text().strip():
        if time.monotonic() > deadline:
            pytest.fail(f"{path} never written")
        time.sleep(0.05)
    return path.read_text().strip()


def test_stop_kills_the_whole_process_group(tmp_path: Path) -> None:
    grandchild_pid = tmp_path / "grandchild.pid"
    process = processes.start_process(
        "forker", ["sh", "-c", f"sleep 300 & echo $! > {grandchild_pid}; wait"], tmp_path / "forker.log"
    )
    grandchild = int(wait_file(grandchild_pid))
    assert process.running() and pid_alive(grandchild)
    process.stop(grace_s=5)
    assert not process.running()
    assert wait_dead(grandchild)


def test_output_goes_to_the_log_file(tmp_path: Path) -> None:
    process = processes.start_process(
        "echo", ["sh", "-c", "echo hello; echo oops >&2"], tmp_path / "echo.log"
    )
    process.popen.wait(timeout=WAIT_S)
    assert process.log_tail().splitlines() == ["hello", "oops"]
    process.stop()


# A parent process that starts one child through the harness, reports the child's pid once the
# child's SIGTERM trap is set (a fixed sleep lost that race on a loaded machine), then ends as the
# test says. The child records SIGTERM, which tells a graceful stop from SIGKILL.
PARENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from strata.cluster import processes

    out, how = Path(sys.argv[1]), sys.argv[2]
    trap = f"trap 'echo term > {out}/terminated; exit 0' TERM; touch {out}/trapped; sleep 300 & wait"
    child = processes.start_process("child", ["sh", "-c", trap], out / "child.log")
    # The pid is reported once the child's trap is set, however slowly the shell starts.
    processes.wait_until(lambda: (out / "trapped").exists(), 300, "the child's trap", interval_s=0.05)
    (out / "child.pid").write_text(str(child.pid))
    if how == "exit":
        sys.exit(0)
    time.sleep(300)
    """
)


def run_parent(tmp_path: Path, how: str) -> tuple[subprocess.Popen[bytes], int]:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path), how])
    return parent, int(wait_file(tmp_path / "child.pid"))


def test_children_are_stopped_gracefully_when_the_parent_exits(tmp_path: Path) -> None:
    parent, child = run_parent(tmp_path, "exit")
    assert parent.wait(timeout=WAIT_S) == 0
    assert wait_dead(child)
    assert (tmp_path / "terminated").read_text().strip() == "term"


def test_children_are_stopped_gracefully_when_the_parent_gets_sigterm(tmp_path: Path) -> None:
    parent, child = run_parent(tmp_path, "wait")
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=WAIT_S) == -signal.SIGTERM
    assert wait_dead(child)
    assert (tmp_path / "terminated").read_text().strip() == "term"


def test_children_die_with_a_sigkilled_parent(tmp_path: Path) -> None:
    parent, child = run_parent(tmp_path, "wait")
    assert pid_alive(child)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait(timeout=WAIT_S)
    # No Python code runs after SIGKILL: only PR_SET_PDEATHSIG can have killed the child.
    assert wait_dead(child)
    assert not (tmp_path / "terminated").exists()
    # PDEATHSIG reaches the direct child only (the components fork nothing); reap its sleep.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child, signal.SIGKILL)


def test_wait_until_names_what_it_waited_for() -> None:
    with pytest.raises(TimeoutError, match="the moon"):
        processes.wait_until(lambda: False, timeout_s=0.1, what="the moon", interval_s=0.02)


def test_supervisor_reports_each_exited_component_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    done = processes.start_process("quitter", ["true"], tmp_path / "quitter.log")
    alive = processes.start_process("stayer", ["sleep", "300"], tmp_path / "stayer.log")
    done.popen.wait(timeout=WAIT_S)
    try:
        with caplog.at_level("ERROR", logger="strata.cluster.supervisor"):
            reported = report_exited([done, alive], set())
            assert reported == {"quitter"}
            assert report_exited([done, alive], reported) == set()
        assert [r.getMessage() for r in caplog.records] == [
            f"quitter exited with code 0; log {tmp_path / 'quitter.log'}"
        ]
    finally:
        alive.stop()
