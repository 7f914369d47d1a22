"""``strata cluster up|status|env|down`` end to end: a detached cluster that ``down`` fully removes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from strata.cluster import cli
from strata.cluster.cli import pid_alive
from tests.foundation.waiting import WAIT_S, eventually

pytestmark = pytest.mark.cluster


def strata_cluster(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "strata", "cluster", *args],
        capture_output=True,
        text=True,
        timeout=2 * WAIT_S,  # `up` waits up to 300 s for the supervisor itself
        check=False,
    )


def test_up_status_env_down_leaves_no_process_behind(tmp_path: Path) -> None:
    directory = tmp_path / "cluster"
    pids: list[int] = []
    up = strata_cluster("up", f"--dir={directory}", "--gpu-nodes=1")
    try:
        assert up.returncode == 0, up.stderr
        assert f"strata cluster env --dir {directory}" in up.stdout
        state = json.loads((directory / "state.json").read_text())
        pids += [state["supervisor_pid"], *state["pids"].values()]
        assert all(pid_alive(pid) for pid in pids)

        # `up` has returned; the cluster keeps running and answers with the written kubeconfig.
        nodes = subprocess.run(
            [
                f"{state['bin_dir']}/kubectl",
                f"--kubeconfig={directory / 'kubeconfig'}",
                "get",
                "nodes",
                "-o",
                "name",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        assert nodes.stdout.split() == ["node/gpu-node-0", "node/local-node-0"]
        status = strata_cluster("status", f"--dir={directory}")
        assert status.returncode == 0, status.stdout + status.stderr
        assert f"apiserver {state['api_url']}: ready" in status.stdout
        env = strata_cluster("env", f"--dir={directory}")
        assert env.stdout.splitlines()[0] == f"export KUBECONFIG={directory / 'kubeconfig'}"
        again = strata_cluster("up", f"--dir={directory}")
        assert again.returncode == 0 and "already running" in again.stdout
    finally:
        down = strata_cluster("down", f"--dir={directory}")
    assert down.returncode == 0, down.stderr
    eventually(lambda: not any(pid_alive(pid) for pid in pids), "every process of the cluster to end")
    assert not (directory / "state.json").exists()
    lock_fd = cli._take_lock(directory)  # the supervisor is gone, and so is its lock
    assert lock_fd is not None
    os.close(lock_fd)
    assert strata_cluster("status", f"--dir={directory}").returncode == 1


def test_a_second_up_while_the_first_is_starting_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "cluster"
    lock_fd = cli._take_lock(directory)  # as a starting supervisor holds it
    assert lock_fd is not None
    try:
        second = strata_cluster("up", f"--dir={directory}")
        assert second.returncode == 1
        assert "another `strata cluster up` is starting" in second.stderr
        assert not directory.exists()
    finally:
        os.close(lock_fd)
    assert cli.lock_path(directory).exists()


def test_down_without_a_cluster_is_a_no_op(tmp_path: Path) -> None:
    result = strata_cluster("down", f"--dir={tmp_path}")
    assert result.returncode == 0
    assert "nothing running" in result.stdout


def test_up_refuses_a_directory_that_is_not_a_cluster(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    result = strata_cluster("up", f"--dir={tmp_path}")
    assert result.returncode != 0
    assert "precious.txt" in result.stderr
    assert (tmp_path / "precious.txt").read_text() == "keep me"
