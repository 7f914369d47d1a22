"""The session fixture tears the cluster down when a test fails and when the run is interrupted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from strata.cluster.cli import pid_alive
from tests.foundation.waiting import WAIT_S, eventually

pytestmark = pytest.mark.cluster

REPO_ROOT = Path(__file__).resolve().parents[2]

# A suite whose first test fails and whose second hangs until interrupted; both record the
# component pids so the outer test can check every one of them is gone afterwards.
INNER_SUITE = """
import json, os, time
from pathlib import Path

OUT = Path(os.environ["TEARDOWN_OUT"])

def record(cluster):
    pids = {p.name: p.pid for p in cluster.owned_processes}
    OUT.joinpath("pids.json").write_text(json.dumps(pids))

def test_fails(cluster):
    record(cluster)
    assert False, "deliberate failure"

def test_hangs(cluster):
    OUT.joinpath("hanging").write_text("yes")
    time.sleep(300)
"""


def test_components_are_gone_after_a_failed_test_and_an_interrupt(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text('pytest_plugins = ["strata.cluster.pytest_plugin"]\n')
    (suite / "test_inner.py").write_text(INNER_SUITE)
    env = {k: v for k, v in os.environ.items() if k != "STRATA_CLUSTER_DIR"}
    env["TEARDOWN_OUT"] = str(tmp_path)
    inner = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(suite), str(suite)],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        # A suite started in the background (`cmd &` in a script) inherits SIGINT ignored, and
        # Python then never raises KeyboardInterrupt: Ctrl-C's default, as at a terminal.
        preexec_fn=_default_sigint,
    )

    try:
        check_teardown(inner, tmp_path)
    finally:
        if inner.poll() is None:  # a failed check: the inner suite (and its cluster) must not outlive it
            inner.kill()
            inner.communicate()


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def check_teardown(inner: subprocess.Popen[str], tmp_path: Path) -> None:
    def hanging() -> bool:
        assert inner.poll() is None, inner.communicate()[0]
        return (tmp_path / "hanging").exists()

    eventually(hanging, "the inner suite to reach its hanging test")
    pids = json.loads((tmp_path / "pids.json").read_text())
    components = {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
        "pod-runtime",
    }
    assert set(pids) == components
    assert all(pid_alive(pid) for pid in pids.values()), "the failed test must not stop the session's cluster"

    inner.send_signal(signal.SIGINT)  # what Ctrl-C delivers
    # Stopping the components takes up to their grace period each (10 s) on a slow machine.
    output = inner.communicate(timeout=WAIT_S)[0]
    assert "deliberate failure" in output and "KeyboardInterrupt" in output
    eventually(
        lambda: not [name for name, pid in pids.items() if pid_alive(pid)], "every component to be gone"
    )
