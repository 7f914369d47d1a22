"""`make demo` is the main job: run it whole, as a user would, and check what it promises."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from strata.cluster.cli import pid_alive
from strata.demo.detached import Detached
from strata.demo.platform import nvme_dir

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.timeout(3600)]
# The walk-through, then the scaling act: worker pods start (torch imports: minutes on a loaded
# two-core machine), two loads of LOAD_S, premium's scale-down after its utilization window.
DEMO_WITHIN_S = 2700


def strata(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "strata", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def scraped(prometheus: str, selector: str, targets: int, timeout_s: float = 60.0) -> bool:
    """Whether Prometheus reports ``targets`` targets matching ``selector`` up (a scrape
    succeeded) within the timeout."""
    query = urllib.parse.urlencode({"query": f"up{{{selector}}} == 1"})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{prometheus}/api/v1/query?{query}", timeout=10) as resp:
            if len(json.load(resp)["data"]["result"]) >= targets:
                return True
        time.sleep(1)
    return False


def test_demo_walks_the_hierarchy_and_stops_cleanly(tmp_path: Path) -> None:
    directory = tmp_path / "demo"
    try:
        up = strata("demo", "--dir", str(directory), timeout=DEMO_WITHIN_S)
        (tmp_path / "demo-output.txt").write_text(up.stdout + up.stderr)  # kept for a look afterwards
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        # The service went Ready under the operator, its pod running for real on the local node,
        # its sidecar and worker processes started by the pod runtime.
        assert re.search(r"tenant-a\s+chat\s+premium\s+demo-small\s+1\s+1", up.stdout), up.stdout
        assert re.search(r"chat-0\s+2/2\s+Running\s+0\s+\S+\s+127\.[\d.]+\s+local-node-0", up.stdout)
        assert "- kvtier" in up.stdout
        assert re.search(r"kvtier\s+pid \d+: strata kvtier serve", up.stdout), up.stdout
        assert re.search(r"engine\s+pid \d+: strata worker serve", up.stdout), up.stdout
        # Each request of the walk was served by the tier it names, and by no other (token counts
        # from the worker's /metrics): DRAM after the engine's crash, DRAM again after engine and
        # sidecar crashed (each restarted by the pod runtime; the sidecar recovered its slot
        # table), NVMe after the pod was deleted and its StatefulSet made a new one, the shared
        # tier at a second replica.
        table = up.stdout[up.stdout.index("prompt tokens served from") :]
        assert re.search(r"cold \(nothing cached\).*none \(recomputed\)", table)
        served = r"\s+[\d.]+\s+[\d.]+x\s+"
        assert re.search(rf"prefix in HBM{served}hbm 3984$", table, re.M), table
        assert re.search(rf"engine crashed: HBM empty, prefix in DRAM{served}dram 3984$", table, re.M), table
        recovered = "both crashed: DRAM recovered, prefix in DRAM"
        assert re.search(rf"{recovered}{served}dram 3984$", table, re.M), table
        assert re.search(rf"pod replaced: DRAM gone, prefix on NVMe{served}nvme 3984$", table, re.M), table
        # A second replica, whose own tiers are empty, found the prefix the first wrote through
        # to the service's shared volume (a KWOK-provisioned claim both pods mount).
        shared_row = rf"second replica: prefix on the shared volume{served}shared 3984$"
        assert re.search(shared_row, table, re.M), table
        # The operator's autoscaler scraped the real worker into the service's status.
        assert re.search(r"ttftP95Ms: \d", up.stdout) and re.search(r"hbm: 0\.9\d*", up.stdout), up.stdout
        _check_the_scaling_act(up.stdout)
        pids = Detached(directory)._read()
        assert set(pids) == {"operator", "prometheus"}  # the worker and sidecar are the pod's
        # Its Prometheus finds the real pod through the chart's monitors: the worker and the sidecar.
        prometheus = re.search(r"Prometheus at (http://127\.0\.0\.1:\d+)", up.stdout)
        assert prometheus, up.stdout
        walk_pod = 'job="strata-system/strata-workers", namespace="tenant-a", pod="chat-0"'
        assert scraped(prometheus.group(1), walk_pod, 2), "Prometheus did not scrape chat-0's two ports"
    finally:
        down = strata("demo", "down", "--dir", str(directory), timeout=120)
    assert down.returncode == 0, down.stderr
    assert not any(pid_alive(pid) for pid in pids.values())
    assert not nvme_dir(directory.resolve()).exists()  # the walk's NVMe tier: 4 GiB of disk


def _check_the_scaling_act(stdout: str) -> None:
    """Premium scaled up under the replayed trace and back down; batch under the same load did
    not; nobody's client saw an error. The closing table has a row per service."""
    act = stdout[stdout.index("7/7 the scaling act") :]
    assert re.search(r"scaled: \d\d:\d\d:\d\d .*: 1 -> [23]", act), act[-5000:]
    rows = {line.split()[0]: line.split() for line in act.splitlines() if line.startswith(("live ", "bulk "))}
    assert set(rows) == {"live", "bulk"}, act[-3000:]
    live, bulk = rows["live"], rows["bulk"]
    assert live[1] == "premium" and int(live[2]) >= 2 and live[4] == "0", live
    assert bulk[1] == "batch" and int(bulk[2]) == 1 and bulk[4] == "0", bulk
    assert int(live[3]) > 50 and int(bulk[3]) > 50, (live, bulk)
    assert re.search(r"scaled: \d\d:\d\d:\d\d .*: 2 -> 1", act), "premium back to one replica"
