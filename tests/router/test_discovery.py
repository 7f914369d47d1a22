"""Pods to endpoints: IP, Ready condition, deletion timestamp; watch events applied in order."""

from __future__ import annotations

from typing import Any

import pytest

from strata.router.config import WorkersConfig
from strata.router.discovery import _changed, pod_state, static_states
from strata.router.kube import KubeError

WORKERS = WorkersConfig(label_selector="app=x", port=8000, kv_events_port=8001)


def pod(
    name: str, ip: str | None = "127.0.0.5", ready: bool = True, deleting: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "status": status}


def test_a_pod_is_an_endpoint_once_it_has_an_ip():
    assert pod_state(pod("a", ip=None), WORKERS) is None
    state = pod_state(pod("a"), WORKERS)
    assert state is not None and state.ready and not state.terminating
    assert state.address.url == "http://127.0.0.5:8000"
    assert state.address.events == {
        "worker": "http://127.0.0.5:8000/kv/events",
        "sidecar": "http://127.0.0.5:8001/kv/events",
    }


def test_readiness_and_termination_come_from_the_pod():
    not_ready = pod_state(pod("a", ready=False), WORKERS)
    terminating = pod_state(pod("a", deleting=True), WORKERS)
    assert not_ready is not None and not not_ready.ready
    assert terminating is not None and terminating.terminating


def test_watch_events_update_the_current_set():
    current: dict[str, Any] = {}
    assert _changed({"type": "ADDED", "object": pod("a")}, WORKERS, current)
    assert not _changed({"type": "MODIFIED", "object": pod("a")}, WORKERS, current)  # nothing new
    assert _changed({"type": "MODIFIED", "object": pod("a", deleting=True)}, WORKERS, current)
    assert current["a"].terminating
    assert not _changed({"type": "BOOKMARK", "object": {"metadata": {}}}, WORKERS, current)
    assert _changed({"type": "DELETED", "object": pod("a", deleting=True)}, WORKERS, current)
    assert current == {}
    with pytest.raises(KubeError, match="too old"):
        _changed(
            {"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}},
            WORKERS,
            current,
        )


def test_static_urls_are_always_ready_and_keep_their_ports():
    workers = WorkersConfig(static=["http://127.0.0.1:9001"], kv_events_port=None)
    (state,) = static_states(workers)
    assert state.ready and state.address.url == "http://127.0.0.1:9001"
    assert state.address.events == {"worker": "http://127.0.0.1:9001/kv/events"}
