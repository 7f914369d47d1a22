"""The long-lived parent of a detached cluster (``strata cluster up``).

The components die with their parent (PR_SET_PDEATHSIG), so a detached cluster needs a parent
that stays: this process. It starts the cluster, records its own pid in ``state.json`` and
waits; SIGTERM (``strata cluster down``), SIGINT or SIGHUP stop the cluster and end it. If it is
SIGKILLed, the kernel takes the components down with it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from strata.cluster.cluster import ClusterConfig
from strata.cluster.components import Layout
from strata.cluster.processes import ManagedProcess
from strata.cluster.startup import launch

log = logging.getLogger("strata.cluster.supervisor")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m strata.cluster.supervisor")
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--gpu-nodes", type=int, default=ClusterConfig.gpu_nodes)
    parser.add_argument("--local-nodes", type=int, default=ClusterConfig.local_nodes)
    parser.add_argument("--local-node-cpu", default=None)
    return parser.parse_args(argv)


def report_exited(running: list[ManagedProcess], reported: set[str]) -> set[str]:
    """Log each component that has exited since the last call (once); the names now known dead."""
    exited = {p.name for p in running if not p.running()} - reported
    for process in running:
        if process.name in exited:
            log.error(
                "%s exited with code %s; log %s", process.name, process.popen.returncode, process.log_path
            )
    return exited


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Installed before launch, so processes.py leaves these signals to us.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, request_stop)
    config = ClusterConfig(
        gpu_nodes=args.gpu_nodes, local_nodes=args.local_nodes, local_node_cpu=args.local_node_cpu
    )
    cluster = launch(args.dir, config)
    try:
        layout = Layout(cluster.directory)
        state = json.loads(layout.state.read_text())
        state["supervisor_pid"] = os.getpid()
        layout.state.write_text(json.dumps(state, indent=2) + "\n")
        log.info("cluster up in %.1fs at %s", cluster.startup_s or 0.0, cluster.api_url)
        reported: set[str] = set()
        while not stop.wait(1.0):
            reported |= report_exited(cluster.owned_processes, reported)
    finally:
        log.info("stopping cluster")
        cluster.stop()
        Layout(cluster.directory).state.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
