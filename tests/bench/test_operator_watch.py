"""The operator benchmark cannot hang or lie: its readiness watch is killed mid-run and the run
still sees every service Ready; a wait that cannot be met ends and counts by a fresh list; a
watch whose resourceVersion the server no longer has lists again."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.bench_operator import ISVC_PATH, Fleet, Scale
from bench.watch import FirstSeen, ResumableWatch, WatchTimeout, ready
from strata.cluster import Cluster
from strata.stack import operator_running, wait_for

pytestmark = pytest.mark.cluster
SERVICES = 4


def kill_stream(watch: ResumableWatch, before: subprocess.Popen[str] | None = None) -> subprocess.Popen[str]:
    """SIGKILL the watch's kubectl as soon as it streams; a stream other than ``before`` (already killed,
    but possibly not yet reaped, so it still looks alive for a moment)."""

    def streaming() -> subprocess.Popen[str] | None:
        proc = watch.proc
        return proc if proc is not None and proc is not before and proc.poll() is None else None

    proc = wait_for(streaming, 60, "a watch")
    proc.kill()
    return proc


def test_a_killed_watch_resumes_and_a_timeout_counts_ready_services(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    with operator_running(cluster, tmp_path / "operator.log") as operator:
        fleet = Fleet(cluster, operator, Scale(services=SERVICES, tenants=1, timeout_s=300))
        fleet.namespaces = [namespace]
        readiness = fleet.watches[0].start()
        try:
            killed = kill_stream(readiness)
            sent = fleet.apply("svc", SERVICES, per_s=None)
            wait_for(lambda: set(sent) & fleet.ready.seen.keys(), 300, "a first Ready service")
            kill_stream(readiness, before=killed)
            ready_at = fleet.wait(fleet.ready, set(sent), "services Ready")
            assert set(ready_at) == set(sent)
            # The watch thread counts a stream's end after reaping its kubectl: wait for it, bounded.
            wait_for(lambda: readiness.resumed + readiness.relisted >= 2, 60, "both killed streams resumed")
            fleet.scale = Scale(timeout_s=1)
            never = {(namespace, "never-applied")}
            with pytest.raises(
                WatchTimeout, match=rf"{SERVICES}/{SERVICES + 1} services Ready by a list now"
            ):
                fleet.wait(fleet.ready, set(sent) | never, "services Ready")
        finally:
            readiness.stop()


def test_a_resource_version_the_server_no_longer_has_means_list_again(cluster: Cluster) -> None:
    watch = ResumableWatch(cluster, ISVC_PATH, FirstSeen(ready))
    assert watch._watch("1") is None  # 410 Gone: resourceVersion 1 is long compacted away
