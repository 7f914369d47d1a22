"""Page-locking the shared slots: only with CUDA, and a refusal leaves no CUDA error behind
(torch's next kernel-launch check would raise it: the engine's first step after connecting
failed so on a GPU whose slots were on a disk file system)."""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import pytest
import torch

from strata.worker.kvtier import pagelock


class FakeCudart:
    def __init__(self, error: int) -> None:
        self.error = error
        self.calls: list[tuple[int, int, int]] = []

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
        self.calls.append((ptr, size, flags))
        return self.error


@pytest.fixture
def cleared(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The runtime libraries whose last error was read off."""
    seen: list[str] = []

    class Library:
        def __init__(self, path: str) -> None:
            self.path = path

        def cudaGetLastError(self) -> int:
            seen.append(self.path)
            return 1

    monkeypatch.setattr(ctypes, "CDLL", Library)
    monkeypatch.setattr(pagelock, "loaded_runtime", lambda: "/opt/lib/libcudart.so.13")
    return seen


def test_without_cuda_nothing_is_registered(monkeypatch, cleared):
    fake = FakeCudart(0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    assert not pagelock.page_lock(torch.zeros(4096, dtype=torch.uint8))
    assert fake.calls == [] and cleared == []


def test_a_registered_mapping_is_page_locked(monkeypatch, cleared):
    buffer = torch.zeros(4096, dtype=torch.uint8)
    fake = FakeCudart(0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    assert pagelock.page_lock(buffer, "/dev/shm/kv")
    assert fake.calls == [(buffer.data_ptr(), 4096, 0)]
    assert cleared == []


def test_a_refused_registration_clears_the_error_and_says_where(monkeypatch, cleared, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: FakeCudart(1))
    with caplog.at_level(logging.WARNING, logger=pagelock.log.name):
        assert not pagelock.page_lock(torch.zeros(10, dtype=torch.uint8), "/var/kv/slots")
    assert cleared == ["/opt/lib/libcudart.so.13"]
    assert "/var/kv/slots returned 1" in caplog.text and "memory file system" in caplog.text


def test_the_runtime_is_found_among_the_process_mappings(tmp_path: Path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 00:00 0 \n"
        "7f01-7f02 r--p 00000000 08:01 42          /usr/lib/libc.so.6\n"
        "7f02-7f03 r-xp 00000000 08:01 43          /opt/nvidia/cuda_runtime/lib/libcudart.so.13\n"
    )
    assert pagelock.loaded_runtime(maps) == "/opt/nvidia/cuda_runtime/lib/libcudart.so.13"
    maps.write_text("7f01-7f02 r--p 00000000 08:01 42          /usr/lib/libc.so.6\n")
    assert pagelock.loaded_runtime(maps) is None
