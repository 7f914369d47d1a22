"""Shared fixtures: ``cluster`` (session-scoped test control plane), ``namespace`` (per test) and
``prometheus`` (session-scoped, started only for the tests that ask for it), defined in
strata.cluster.pytest_plugin so other projects' suites could load them too (docs/cluster.md for
the API); and ``nvme_reads`` (the KV tiers' and their benchmark's tests).
"""

from __future__ import annotations

from typing import Any

import pytest

from strata.worker.kvtier.nvme import NvmeStore

pytest_plugins = ["strata.cluster.pytest_plugin", "strata.observe.pytest_plugin"]


@pytest.fixture
def nvme_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every batch the NVMe store reads from now on (``NvmeStore.read``)."""
    sizes: list[int] = []
    real_read = NvmeStore.read

    def counted(store: NvmeStore, requests: Any) -> Any:
        sizes.append(len(requests))
        return real_read(store, requests)

    monkeypatch.setattr(NvmeStore, "read", counted)
    return sizes
