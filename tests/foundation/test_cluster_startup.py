"""Start-up failure handling against the real binaries: a taken port is retried, nothing leaks."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from strata.cluster import ClusterConfig, startup
from strata.cluster.cli import pid_alive

pytestmark = pytest.mark.cluster


def test_a_port_taken_before_etcd_binds_it_is_retried_with_fresh_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_free_ports = startup._free_ports
    calls: list[list[int]] = []
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]

        def first_one_taken(count: int) -> list[int]:
            ports = real_free_ports(count)
            if not calls:
                ports[0] = taken  # etcd's client port
            calls.append(ports)
            return ports

        monkeypatch.setattr(startup, "_free_ports", first_one_taken)
        cluster = startup.launch(tmp_path / "cluster", ClusterConfig(gpu_nodes=0))
    try:
        assert len(calls) == 2
        assert cluster.api_url.endswith(f":{calls[1][2]}")
        assert cluster.kubectl("get", "serviceaccount", "default").returncode == 0
        assert "address already in use" in (tmp_path / "cluster" / "logs" / "etcd.log").read_text()
    finally:
        pids = [process.pid for process in cluster.owned_processes]
        cluster.stop()
    assert not [pid for pid in pids if pid_alive(pid)]
