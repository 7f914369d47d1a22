"""The walk-through's decisions, without a cluster: when a crashed or replaced pod counts as
back, what the metrics say per tier, the table, the volumes as shown, and what the walk's pod
asks of the node."""

from __future__ import annotations

from typing import Any

from strata.common.tiers import TIERS
from strata.demo import dataplane, platform
from strata.demo.walk import blocks_of, replaced_and_ready, restart_counts, restarted_and_ready, table


def pod(engine: tuple[int, bool], kvtier: tuple[int, bool], pod_ready: bool) -> dict[str, Any]:
    def status(name: str, restarts: int, ready: bool) -> dict[str, Any]:
        return {"name": name, "restartCount": restarts, "ready": ready}

    return {
        "status": {
            "initContainerStatuses": [status("model", 0, False), status("kvtier", *kvtier)],
            "containerStatuses": [status("engine", *engine)],
            "conditions": [{"type": "Ready", "status": "True" if pod_ready else "False"}],
        }
    }


def test_restart_counts_cover_init_and_main_containers() -> None:
    assert restart_counts(pod((2, True), (1, True), True)) == {"model": 0, "kvtier": 1, "engine": 2}
    assert restart_counts({"status": {}}) == {}


def test_a_crashed_container_is_back_once_restarted_ready_and_the_pod_ready() -> None:
    before = {"engine": 0}
    assert not restarted_and_ready(pod((0, True), (0, True), True), before)  # not restarted yet
    assert not restarted_and_ready(pod((1, False), (0, True), False), before)  # restarted, probing
    assert not restarted_and_ready(pod((1, True), (0, True), False), before)  # the pod not Ready yet
    assert restarted_and_ready(pod((1, True), (0, True), True), before)


def test_both_containers_must_have_restarted() -> None:
    before = {"kvtier": 0, "engine": 1}
    assert not restarted_and_ready(pod((2, True), (0, True), True), before)
    assert not restarted_and_ready(pod((1, True), (1, True), True), before)
    assert restarted_and_ready(pod((2, True), (1, True), True), before)


def test_a_replaced_pod_is_back_once_a_new_uid_is_ready() -> None:
    def named(uid: str, ready: bool) -> dict[str, Any]:
        return {"metadata": {"uid": uid}, **pod((0, ready), (0, ready), ready)}

    assert not replaced_and_ready([], "old")  # deleted, its successor not created yet
    assert not replaced_and_ready([named("old", True)], "old")  # still terminating
    assert not replaced_and_ready([named("new", False)], "old")  # created, not Ready yet
    assert replaced_and_ready([named("new", True)], "old")


def test_only_full_blocks_are_counted() -> None:
    assert blocks_of(3984, 16) == 249
    assert blocks_of(15, 16) == 0


def test_per_tier_reads_one_family_by_tier_label() -> None:
    metrics = "\n".join(
        [
            "# HELP strata_kvtier_blocks Blocks held.",
            'strata_kvtier_blocks{tier="dram"} 249.0',
            'strata_kvtier_blocks{tier="nvme"} 12.0',
            'strata_kvtier_blocks_total{tier="nvme"} 99.0',
            'strata_kvtier_used_bytes{tier="nvme"} 4096.0',
        ]
    )
    assert dataplane.per_tier(metrics, "strata_kvtier_blocks") == {
        "hbm": 0.0,
        "dram": 249.0,
        "nvme": 12.0,
        "shared": 0.0,
    }


def test_the_table_names_the_tiers_that_served_each_row() -> None:
    rows: list[tuple[str, float, dict[str, float]]] = [
        ("cold (nothing cached)", 0.8, dict.fromkeys(TIERS, 0.0)),
        ("again: prefix in HBM", 0.1, {"hbm": 3984.0, "dram": 0.0, "nvme": 0.0, "shared": 0.0}),
    ]
    lines = table(rows)
    assert lines[1].endswith("1.0x   none (recomputed)")
    assert lines[2].endswith("8.0x   hbm 3984")


def test_volume_lines_say_what_survives_a_container_restart() -> None:
    volumes = [
        {"name": "config", "configMap": {"name": "chat-config"}},
        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1280Mi"}},
        {"name": "model", "emptyDir": {}},
        {"name": "nvme", "hostPath": {"path": "/d/nvme", "type": "DirectoryOrCreate"}},
    ]
    assert platform.volume_lines(volumes) == [
        "config: ConfigMap chat-config",
        "shm: emptyDir, a tmpfs of 1280Mi (lives as long as the pod)",
        "model: emptyDir, a directory (lives as long as the pod)",
        "nvme: hostPath /d/nvme (the node's; outlives the pod)",
    ]


def test_the_walk_pod_asks_its_engine_and_sidecar_cpu() -> None:
    assert platform.walk_pod_millicpu() == 250 + 500


def test_observed_at_is_the_scrape_time_in_utc() -> None:
    observed = platform.observed_at({"observedAt": "2026-12-01T01:24:38Z"})
    assert observed is not None and observed.isoformat() == "2026-12-01T01:24:38+00:00"
    assert platform.observed_at({}) is None
