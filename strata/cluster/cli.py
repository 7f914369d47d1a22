"""``strata cluster up|down|env|status``: a detached local control plane for people and the demo.

State lives in one directory (default ``<repo>/.demo/cluster``): certificates, kubeconfig, logs
and ``state.json`` with the pids. ``up`` returns while a supervisor process keeps the cluster
running; ``down`` stops it and leaves no process behind.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata.cluster import binaries, components, health
from strata.cluster.cluster import check_cpu_quantity
from strata.cluster.locks import try_lock

DEFAULT_DIR = binaries.REPO_ROOT / ".demo" / "cluster"
UP_TIMEOUT_S = 300.0
# The supervisor stops its components one by one, each within its grace period (10 s): a bound for
# a loaded machine, after which `down` kills it and the kernel takes the components down with it.
DOWN_TIMEOUT_S = 120.0


class NotAClusterDirectoryError(ValueError):
    """``--dir`` points at a directory holding files a cluster did not write."""


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped) counts as gone."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _read_state(directory: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(components.Layout(directory).state.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return state


def _supervisor_pid(state: dict[str, Any] | None) -> int | None:
    pid = (state or {}).get("supervisor_pid")
    return pid if isinstance(pid, int) and pid_alive(pid) else None


def _clear_directory(directory: Path) -> None:
    """Remove a stopped cluster's leftovers; refuse to touch a directory that is not ours."""
    if not directory.exists():
        return
    ours = {
        "pki",
        "logs",
        "etcd-data",
        "kubeconfigs",
        "kubeconfig",
        "state.json",
        ".kube-cache",
        "pod-runtime",
    }
    strangers = sorted(p.name for p in directory.iterdir() if p.name not in ours)
    if strangers:
        raise NotAClusterDirectoryError(
            f"--dir {directory}: holds files that are not a cluster's: {strangers}"
        )
    shutil.rmtree(directory)


def _wait_for_supervisor(directory: Path, supervisor: subprocess.Popen[bytes], log_path: Path) -> bool:
    deadline = time.monotonic() + UP_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if _supervisor_pid(_read_state(directory)) == supervisor.pid:
                return True
            if supervisor.poll() is not None:
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        # The supervisor runs in its own session, out of reach of the terminal's Ctrl-C.
        supervisor.send_signal(signal.SIGTERM)
        raise
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:]) if log_path.exists() else ""
    print(f"strata cluster: start failed; supervisor log {log_path}:\n{tail}", file=sys.stderr)
    if supervisor.poll() is None:
        supervisor.send_signal(signal.SIGTERM)
    return False


def usage_text(directory: Path, state: dict[str, Any]) -> str:
    dir_flag = "" if directory == DEFAULT_DIR else f" --dir {directory}"
    return "\n".join(
        [
            f"cluster up at {state['api_url']} (started in {state.get('startup_s')}s), state in {directory}",
            "use it:",
            f'  eval "$(strata cluster env{dir_flag})"    # sets KUBECONFIG, puts kubectl and helm on PATH',
            "  kubectl get nodes -L nvidia.com/gpu.product,strata.dev/pod-runtime",
            f"logs: {directory / 'logs'}",
            f"stop: strata cluster down{dir_flag}",
        ]
    )


def lock_path(directory: Path) -> Path:
    """The lock a supervisor holds for its whole life; beside the directory, which ``up`` clears."""
    return directory.with_name(f"{directory.name}.lock")


def _take_lock(directory: Path) -> int | None:
    """An fd holding the directory's lock, or None when a supervisor holds it (running or starting)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    return try_lock(lock_path(directory))


def _spawn_supervisor(
    directory: Path, nodes: NodeCounts, lock_fd: int, log_path: Path
) -> subprocess.Popen[bytes]:
    # The supervisor inherits the locked fd, so the lock lives exactly as long as the supervisor.
    argv = [
        sys.executable,
        "-m",
        "strata.cluster.supervisor",
        f"--dir={directory}",
        f"--gpu-nodes={nodes.gpu}",
        f"--local-nodes={nodes.local}",
        *([f"--local-node-cpu={nodes.local_cpu}"] if nodes.local_cpu else []),
    ]
    with log_path.open("ab") as log_file:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=(lock_fd,),
        )


@dataclass(frozen=True)
class NodeCounts:
    """What ``up`` creates: KWOK GPU nodes, and local nodes whose pods run for real."""

    gpu: int = 4
    local: int = 1
    local_cpu: str | None = None


def cmd_up(directory: Path, nodes: NodeCounts = NodeCounts()) -> int:
    binaries.find_bin_dir()  # fail here, with the clear message, rather than in the supervisor's log
    lock_fd = _take_lock(directory)
    if lock_fd is None:
        state = _read_state(directory)
        if state is not None and _supervisor_pid(state) is not None:
            print(f"strata cluster: already running\n{usage_text(directory, state)}")
            return 0
        print(
            f"strata cluster: another `strata cluster up` is starting a cluster in {directory}",
            file=sys.stderr,
        )
        return 1
    try:
        _clear_directory(directory)
        log_path = components.Layout(directory).logs / "supervisor.log"
        log_path.parent.mkdir(parents=True)
        supervisor = _spawn_supervisor(directory, nodes, lock_fd, log_path)
    finally:
        os.close(lock_fd)
    if not _wait_for_supervisor(directory, supervisor, log_path):
        return 1
    print(usage_text(directory, _read_state(directory) or {}))
    return 0


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (alive := [p for p in pids if pid_alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return alive


def _is_component(pid: int, bin_dir: str) -> bool:
    # Guards against pid reuse: only kill a pid whose executable is still one of ours.
    try:
        return os.readlink(f"/proc/{pid}/exe").startswith(bin_dir)
    except OSError:
        return False


def cmd_down(directory: Path) -> int:
    state = _read_state(directory)
    if state is None:
        print(f"strata cluster: nothing running in {directory}")
        return 0
    supervisor = _supervisor_pid(state)
    if supervisor is not None:
        os.kill(supervisor, signal.SIGTERM)
        if _wait_gone([supervisor], DOWN_TIMEOUT_S):
            # Hung: SIGKILL it; PR_SET_PDEATHSIG then takes its components down too.
            with contextlib.suppress(ProcessLookupError):
                os.kill(supervisor, signal.SIGKILL)
            _wait_gone([supervisor], 5.0)
    components_pids = [int(p) for p in state.get("pids", {}).values()]
    leftovers = [p for p in components_pids if pid_alive(p) and _is_component(p, state["bin_dir"])]
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    still = _wait_gone(leftovers, 5.0)
    components.Layout(directory).state.unlink(missing_ok=True)
    if still:
        print(f"strata cluster: could not stop pids {still}", file=sys.stderr)
        return 1
    print(f"strata cluster: stopped ({directory})")
    return 0


def cmd_env(directory: Path) -> int:
    state = _read_state(directory)
    if state is None:
        print(f"strata cluster: nothing running in {directory}; run `strata cluster up`", file=sys.stderr)
        return 1
    print(f"export KUBECONFIG={state['kubeconfig']}")
    print(f"export PATH={state['bin_dir']}:$PATH")
    return 0


def cmd_status(directory: Path) -> int:
    state = _read_state(directory)
    if state is None:
        print(f"strata cluster: nothing running in {directory}")
        return 1
    supervisor = _supervisor_pid(state)
    lines = [f"supervisor: {'running pid ' + str(supervisor) if supervisor else 'not running'}"]
    down = [name for name, pid in state.get("pids", {}).items() if not pid_alive(int(pid))]
    for name, pid in state.get("pids", {}).items():
        lines.append(f"{name}: {'exited' if name in down else 'running'} (pid {pid})")
    ca = components.Layout(directory).pki / "ca.crt"
    ready = health.is_healthy(f"{state['api_url']}/readyz", health.tls_context(ca))
    lines.append(f"apiserver {state['api_url']}: {'ready' if ready else 'NOT ready'}")
    print("\n".join(lines))
    if ready:
        subprocess.run(
            [f"{state['bin_dir']}/kubectl", f"--kubeconfig={state['kubeconfig']}", "get", "nodes"],
            check=False,
        )
    return 0 if ready and supervisor and not down else 1


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="strata cluster", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "env", "status"])
    parser.add_argument(
        "--dir", type=Path, default=DEFAULT_DIR, help=f"state directory (default {DEFAULT_DIR})"
    )
    parser.add_argument("--gpu-nodes", type=int, default=4, help="KWOK GPU nodes to create (up only)")
    parser.add_argument(
        "--local-nodes", type=int, default=1, help="nodes whose pods run as processes here (up only)"
    )
    parser.add_argument(
        "--local-node-cpu", default=None, help="CPU each local node offers (default: this machine's CPUs)"
    )
    args = parser.parse_args(argv)
    for flag in ("gpu_nodes", "local_nodes"):
        if getattr(args, flag) < 0:
            parser.error(f"--{flag.replace('_', '-')}: must be >= 0, got {getattr(args, flag)}")
    if args.local_node_cpu is not None:
        try:
            check_cpu_quantity(args.local_node_cpu, "--local-node-cpu")
        except ValueError as error:
            parser.error(str(error))
    args.dir = args.dir.resolve()
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        if args.command == "up":
            return cmd_up(args.dir, NodeCounts(args.gpu_nodes, args.local_nodes, args.local_node_cpu))
        if args.command == "down":
            return cmd_down(args.dir)
        if args.command == "env":
            return cmd_env(args.dir)
        return cmd_status(args.dir)
    except KeyboardInterrupt:
        print("strata cluster: interrupted", file=sys.stderr)
        return 130
    except (binaries.MissingBinariesError, NotAClusterDirectoryError) as error:
        print(f"strata cluster: {error}", file=sys.stderr)
        return 1
