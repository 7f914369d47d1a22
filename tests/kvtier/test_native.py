"""The compiled copy-and-checksum routine: its digest is python-xxhash's XXH3-64 of the bytes at
every size around XXH3's internal boundaries and the copy's chunk size; it is built once into a
cache (racing builders included), refused when foreign, and its absence is a logged fallback."""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
import torch
import xxhash

from strata.worker.kvtier import native, xxh3parts
from strata.worker.kvtier.blockcopy import NATIVE_CHUNK_BYTES

COMPILER = shutil.which("cc")
BUILDABLE = COMPILER is not None and native.header() is not None
needs_cc = pytest.mark.skipif(COMPILER is None, reason="no C compiler on this machine")
needs_build = pytest.mark.skipif(not BUILDABLE, reason="no C compiler or no xxhash.h (libxxhash-dev) here")
K = 1024
# XXH3 switches paths at 16, 128 and 240 bytes, and hashes long inputs in 1 KiB blocks.
SIZES = [0, 1, 3, 16, 17, 128, 129, 240, 241, 1023, 1024, 1025, 1089, 4 * K + 63]
SIZES += [NATIVE_CHUNK_BYTES - 1, NATIVE_CHUNK_BYTES, NATIVE_CHUNK_BYTES + 1, 3 * NATIVE_CHUNK_BYTES + 5]
SIZES += [2 * K * K, 2 * K * K + 3]


@pytest.fixture(scope="module")
def routine() -> native.CopyHash:
    if not BUILDABLE:
        pytest.skip("no C compiler or no xxhash.h (libxxhash-dev) here")
    loaded = native.copyhash()
    assert loaded is not None, "a compiler and the header are here, so the routine must build and load"
    return loaded


def random_bytes(count: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (count,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("chunk", [0, 1, K, NATIVE_CHUNK_BYTES, K * K])
def test_copy_hash_is_a_copy_and_xxh3_of_it(routine, size, chunk):
    src, dst = random_bytes(size + 1, size), torch.zeros(size + 1, dtype=torch.uint8)
    digest = routine.copy_hash(dst.data_ptr(), src.data_ptr(), size, chunk)
    assert digest == xxhash.xxh3_64_intdigest(src.numpy().data[:size])
    assert torch.equal(dst[:size], src[:size])
    assert dst[size] == 0, "not one byte past the end"


def test_hash_and_batch_agree_with_xxhash(routine):
    sources = [random_bytes(size, size) for size in (0, 241, NATIVE_CHUNK_BYTES + 7, 2 * K * K)]
    out = [torch.zeros_like(s) for s in sources]
    copies = [(o.data_ptr(), s.data_ptr(), s.numel()) for o, s in zip(out, sources, strict=True)]
    sums = routine.copy_hash_many(copies, NATIVE_CHUNK_BYTES)
    expected = [xxhash.xxh3_64_intdigest(s.numpy().data) for s in sources]
    assert sums == expected
    assert [routine.hash(s.data_ptr(), s.numel()) for s in sources] == expected
    assert all(torch.equal(o, s) for o, s in zip(out, sources, strict=True))


@pytest.mark.parametrize("offset", [0, 1, 8, 16])  # the destination's alignment: streamed at 0 and 16
@pytest.mark.parametrize("size", SIZES)
def test_a_streamed_copy_is_the_same_copy_and_the_same_digest(routine, size, offset):
    src = random_bytes(size + 1, size)
    dst = torch.zeros(size + offset + 64, dtype=torch.uint8)
    start = dst.data_ptr() + offset
    [digest] = routine.copy_hash_many([(start, src.data_ptr(), size)], NATIVE_CHUNK_BYTES, stream=True)
    assert digest == xxhash.xxh3_64_intdigest(src.numpy().data[:size])
    assert torch.equal(dst[offset : offset + size], src[:size])
    assert not dst[:offset].any() and not dst[offset + size :].any(), "not one byte outside it"


@needs_build
def test_racing_builders_share_one_library(tmp_path):
    """Engine and sidecar may build at once: both end with a loadable library, no temp left."""
    results: list[Path | None] = []
    threads = [
        threading.Thread(target=lambda: results.append(native.build(tmp_path, str(COMPILER))))
        for _ in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert len(results) == 3 and len(set(results)) == 1 and results[0] is not None
    assert [p.name for p in tmp_path.iterdir()] == [results[0].name]
    assert native.bind(results[0]).hash(0, 0) == xxhash.xxh3_64_intdigest(b"")


@pytest.mark.skipif(native.header() is None, reason="no xxhash.h (libxxhash-dev) here")
def test_without_a_compiler_it_falls_back_and_says_why(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native.build(tmp_path, str(tmp_path / "no-such-cc")) is None
    (record,) = [r for r in caplog.records if getattr(r, "event", None) == "native_fallback"]
    assert "no-such-cc" in record.getMessage()
    assert list(tmp_path.iterdir()) == [], "no temporary file left behind"


def test_without_xxhash_h_it_falls_back_and_names_the_package(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(native, "INCLUDE_DIRS", (str(tmp_path / "none"),))
    monkeypatch.delenv("C_INCLUDE_PATH", raising=False)
    monkeypatch.delenv("CPATH", raising=False)
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native.build(tmp_path, str(COMPILER or "cc")) is None
    (record,) = [r for r in caplog.records if getattr(r, "event", None) == "native_fallback"]
    assert "libxxhash-dev" in record.getMessage()


def test_the_secret_is_the_headers(routine):
    """The GPU's hash keys its words with the secret the host's library was built with."""
    assert routine.secret() == xxh3parts.from_header(native.header())
    assert len(routine.secret()) == xxh3parts.SECRET_BYTES


@needs_cc
def test_a_library_of_another_abi_is_refused(tmp_path):
    source = tmp_path / "foreign.c"
    source.write_text("int strata_copyhash_abi(void) { return 999; }\n")
    library = tmp_path / "foreign.so"
    subprocess.run([str(COMPILER), "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    with pytest.raises(RuntimeError, match="ABI 999"):
        native.bind(library)


def test_the_cache_key_names_sources_compiler_and_flags():
    keys = {
        native.build_key("cc", ("-O3",)),
        native.build_key("clang", ("-O3",)),
        native.build_key("cc", ("-O3", "-march=native")),
    }
    assert len(keys) == 3
    assert native.build_key("cc", ("-O3",)) == native.build_key("cc", ("-O3",))


def test_an_unwritable_cache_home_falls_back_to_the_temp_directory(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("")  # a file where the cache directory would go: mkdir fails
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    assert native.cache_dir().parent == tmp_path
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert native.cache_dir() == tmp_path / "cache" / "strata"
