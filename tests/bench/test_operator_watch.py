"""The operator benchmark cannot hang or lie: its readiness watch is killed mid-run and the run
still sees every service Ready; a wait that cannot be met ends and counts by a fresh list; a
watch whose resourceVersion the server no longer has lists again."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.bench_operator import ISVC_PATH, Fleet, Scale
from bench.watch import FirstSeen, ResumableWatch, WatchTimeout, ready
from strata.cluster import Cluster
from strata.stack import operator_running, wait_for

pytestmark = pytest.mark.cluster
SERVICES = 4


def kill_stream(watch: ResumableWatch) -> None:
    """SIGKILL the watch's kubectl as soon as it streams."""
    proc = wait_for(lambda: watch.proc if watch.proc and watch.proc.poll() is None else None, 60, "a watch")
    proc.kill()


def test_a_killed_watch_resumes_and_a_timeout_counts_ready_services(
    cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    with operator_running(cluster, tmp_path / "operator.log") as operator:
        fleet = Fleet(cluster, operator, Scale(services=SERVICES, tenants=1, timeout_s=300))
        fleet.namespaces = [namespace]
        readiness = fleet.watches[0].start()
        try:
            kill_stream(readiness)
            sent = fleet.apply("svc", SERVICES, per_s=None)
            wait_for(lambda: set(sent) & fleet.ready.seen.keys(), 300, "a first Ready service")
            kill_stream(readiness)
            ready_at = fleet.wait(fleet.ready, set(sent), "services Ready")
            assert set(ready_at) == set(sent)
            assert readiness.resumed + readiness.relisted >= 2
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
