"""The compiled copy-and-checksum routine (``copyhash.c``), built on first use and loaded with
ctypes, which releases the GIL for each call.

The library is compiled with the system's C compiler (``$CC``, else ``cc``) on the system's
``xxhash.h`` (Debian's libxxhash-dev, which ``make venv`` installs: tools/native-deps.sh) into a
cache directory, named by a hash of the sources, the header, the flags and this CPU's features,
so a change to any of them builds afresh and a home shared by unlike machines never loads a library built for
another CPU. Engine and sidecar may build at once: each compiles into a temporary name and
renames it into place atomically. ``strata kvtier build-native`` builds it ahead (``make venv``
does). Without a compiler or the header (or with a failing one) the callers fall back to the
Python path, and say so once in the log.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import xxhash

log = logging.getLogger(__name__)

SOURCES = Path(__file__).parent
SOURCE_FILES = ("copyhash.c",)
HEADER = "xxhash.h"
INCLUDE_DIRS = ("/usr/local/include", "/usr/include")  # after $C_INCLUDE_PATH and $CPATH
ABI = 3  # strata_copyhash_abi() of the library this module binds to
# -march=native: XXH3's AVX2/AVX-512 loops are 2x its SSE2 one here (the copy's hash rides on
# them); the cache key names the CPU's features. Compilers refusing it get the portable flags.
FLAG_SETS = (("-O3", "-march=native"), ("-O3",))
BUILD_TIMEOUT_S = 300  # a cold compile is about a second; a loaded machine may be far slower


@dataclass(frozen=True)
class CopyHash:
    """The library's entry points, typed."""

    lib: ctypes.CDLL
    path: Path

    def copy_hash(self, dst: int, src: int, size: int, chunk: int) -> int:
        """Copy ``size`` bytes from address ``src`` to ``dst``; XXH3-64 of them."""
        return int(self.lib.strata_copy_hash(dst, src, size, chunk))

    def copy_hash_many(
        self, copies: list[tuple[int, int, int]], chunk: int, stream: bool = False
    ) -> list[int]:
        """``copy_hash`` of every ``(dst, src, size)`` in one call: one GIL handover for all.
        ``stream``: into destinations no core reads soon (shared-memory slots), with
        non-temporal stores (1.16-1.28x the bytes per CPU-second of the cached copy here)."""
        count = len(copies)
        dsts = (ctypes.c_void_p * count)(*(c[0] for c in copies))
        srcs = (ctypes.c_void_p * count)(*(c[1] for c in copies))
        sizes = (ctypes.c_size_t * count)(*(c[2] for c in copies))
        sums = (ctypes.c_uint64 * count)()
        routine = self.lib.strata_copy_hash_stream_many if stream else self.lib.strata_copy_hash_many
        routine(dsts, srcs, sizes, count, chunk, sums)
        return list(sums)

    def hash(self, address: int, size: int) -> int:
        """XXH3-64 of ``size`` bytes at ``address``."""
        return int(self.lib.strata_hash(address, size))

    def secret(self) -> bytes:
        """XXH3's default secret, as the header the library was built on has it."""
        return ctypes.string_at(self.lib.strata_xxh3_secret(), self.lib.strata_xxh3_secret_size())


@functools.cache
def copyhash() -> CopyHash | None:
    """The routine, built and loaded once per process; None where it cannot be (logged once)."""
    path = build(cache_dir(), os.environ.get("CC", "cc"))
    if path is None:
        return None
    try:
        return bind(path)
    except (OSError, RuntimeError) as err:
        _fallback(f"cannot load {path}: {err}")
        return None


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/strata`` or ``~/.cache/strata``; the temp directory where neither can be
    written (a read-only home in a container)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    for candidate in (Path(base) / "strata", Path(tempfile.gettempdir()) / f"strata-cache-{os.getuid()}"):
        try:
            candidate.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(candidate, os.W_OK):
            return candidate
    return Path(tempfile.gettempdir())


def header() -> Path | None:
    """The system's ``xxhash.h``, where the compiler looks for it first; None where there is none."""
    listed = (d for name in ("C_INCLUDE_PATH", "CPATH") for d in os.environ.get(name, "").split(os.pathsep))
    for directory in (*(d for d in listed if d), *INCLUDE_DIRS):
        if (Path(directory) / HEADER).is_file():
            return Path(directory) / HEADER
    return None


def build(directory: Path, compiler: str) -> Path | None:
    """The library in ``directory``, compiled now unless already there; None (logged) when there
    is no header to build it on or no flag set compiles it."""
    found = header()
    if found is None:
        _fallback(f"no {HEADER} to build {SOURCE_FILES[0]} on: install libxxhash-dev (tools/native-deps.sh)")
        return None
    errors: list[str] = []
    for flags in FLAG_SETS:
        target = directory / f"copyhash-{build_key(compiler, flags)}.so"
        if target.exists():
            return target
        error = _compile(compiler, (f"-I{found.parent}", *flags), target)
        if error is None:
            return target
        errors.append(error)
    _fallback(f"cannot compile {SOURCES / SOURCE_FILES[0]} with {compiler}: {errors[-1]}")
    return None


def build_key(compiler: str, flags: tuple[str, ...]) -> str:
    digest = hashlib.sha256()
    for name in SOURCE_FILES:
        digest.update((SOURCES / name).read_bytes())
    found = header()
    digest.update(found.read_bytes() if found is not None else b"")
    digest.update(" ".join((compiler, *flags, platform.machine(), _cpu_features())).encode())
    return digest.hexdigest()[:16]


def _cpu_features() -> str:
    """The CPU's feature flags (Linux), the part of the key that -march=native depends on."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    return next((line for line in info.splitlines() if line.startswith(("flags", "Features"))), "")


def _compile(compiler: str, flags: tuple[str, ...], target: Path) -> str | None:
    """Compile into a temporary name and rename it into place; the error, or None."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    command = [compiler, *flags, "-shared", "-fPIC", "-o", tmp, str(SOURCES / SOURCE_FILES[0])]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        if done.returncode != 0:
            return done.stderr.strip()[-500:] or f"exit status {done.returncode}"
        os.replace(tmp, target)
        log.info(
            "kvtier: built %s", target, extra={"event": "native_built", "path": str(target), "flags": flags}
        )
        return None
    except (OSError, subprocess.SubprocessError) as err:
        return str(err)
    finally:
        Path(tmp).unlink(missing_ok=True)


def bind(path: Path) -> CopyHash:
    """Load the library, declare its signatures, and check it against python-xxhash once."""
    lib = ctypes.CDLL(str(path))
    lib.strata_copyhash_abi.restype = ctypes.c_int
    if lib.strata_copyhash_abi() != ABI:
        raise RuntimeError(f"ABI {lib.strata_copyhash_abi()}, expected {ABI}")
    lib.strata_copy_hash.restype = ctypes.c_uint64
    lib.strata_copy_hash.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    lib.strata_hash.restype = ctypes.c_uint64
    lib.strata_hash.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.strata_xxh3_secret.restype = ctypes.c_void_p
    lib.strata_xxh3_secret_size.restype = ctypes.c_size_t
    pointers = ctypes.POINTER(ctypes.c_void_p)
    sizes, sums = ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_uint64)
    for many in (lib.strata_copy_hash_many, lib.strata_copy_hash_stream_many):
        many.restype = None
        many.argtypes = [pointers, pointers, sizes, ctypes.c_size_t, ctypes.c_size_t, sums]
    kernel = CopyHash(lib, path)
    _self_check(kernel)
    return kernel


def _self_check(kernel: CopyHash) -> None:
    """A miscompiled or foreign library must not checksum blocks: compare with python-xxhash."""
    probe = bytes(range(256)) * 20 + b"strata"
    src = ctypes.create_string_buffer(probe, len(probe))
    dst = ctypes.create_string_buffer(len(probe))
    want = xxhash.xxh3_64_intdigest(probe)
    got = kernel.copy_hash(ctypes.addressof(dst), ctypes.addressof(src), len(probe), 1024)
    if got != want or dst.raw != probe:
        raise RuntimeError("its copy or XXH3 differs from python-xxhash's")
    streamed = ctypes.create_string_buffer(len(probe) + 64)
    aligned = -ctypes.addressof(streamed) % 64  # the streaming stores need an aligned target
    copy = (ctypes.addressof(streamed) + aligned, ctypes.addressof(src), len(probe))
    got = kernel.copy_hash_many([copy], 1024, stream=True)[0]
    if got != want or streamed.raw[aligned : aligned + len(probe)] != probe:
        raise RuntimeError("its streaming copy or XXH3 differs from python-xxhash's")


def _fallback(reason: str) -> None:
    log.warning(
        "kvtier: no compiled copy-and-checksum (%s); block copies take the slower Python path",
        reason,
        extra={"event": "native_fallback", "reason": reason},
    )


def path_name() -> str:
    """Which copy path this process runs: ``native`` or ``python`` (for the bench's JSON)."""
    return "native" if copyhash() is not None else "python"
