"""Page-locking the sidecar's shared slots for a CUDA engine, so that block copies between the
slots and the GPU are DMA (asynchronous, at the copy engine's rate) rather than staged through
the driver's pageable path.

Best effort: a mapping the driver cannot pin (a file on a disk file system: Linux refuses
long-lived pins of writable file-backed pages that are not memory-backed) still works, with
synchronous copies at a fraction of the rate, and the client says so in its log (at each
connection). A failed ``cudaHostRegister`` also leaves the CUDA runtime's last-error set, and
torch's next kernel-launch check raises it as its own ("CUDA error: invalid argument"), so the
error is read off at once: without that the engine's first step after connecting fails.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


def _cudart() -> Any:
    return torch.cuda.cudart()  # type: ignore[no-untyped-call]


def page_lock(buffer: torch.Tensor, where: str = "") -> bool:
    """Register ``buffer`` (the slots' mapping, from ``where``) as page-locked memory; True when
    it is. False without CUDA, and when the driver refused (the error is cleared, and logged)."""
    if not torch.cuda.is_available():
        return False
    try:
        error = int(_cudart().cudaHostRegister(buffer.data_ptr(), buffer.numel(), 0))
    except (RuntimeError, AttributeError, TypeError) as err:
        log.warning("kvtier: cannot page-lock the shared slots (%s); device copies are synchronous", err)
        return False
    if error:
        clear_last_error()
        log.warning(
            "kvtier: cudaHostRegister of the shared slots %s returned %d; block copies to and from the GPU "
            "are synchronous and several times slower. Put dram.shm_path on a memory file system "
            "(/dev/shm, or an emptyDir with medium: Memory)",
            where,
            error,
            extra={"event": "page_lock_refused", "shm_path": where, "cuda_error": error},
        )
    return error == 0


def page_unlock(buffer: torch.Tensor) -> None:
    _cudart().cudaHostUnregister(buffer.data_ptr())


def clear_last_error() -> None:
    """Read off the CUDA runtime's last error, in the runtime torch loaded (found by its path
    among this process's mappings: a second copy of the library would keep its own)."""
    runtime = loaded_runtime()
    if runtime is None:
        log.warning("kvtier: no CUDA runtime library among this process's mappings to clear an error in")
        return
    ctypes.CDLL(runtime).cudaGetLastError()


def loaded_runtime(maps: Path = Path("/proc/self/maps")) -> str | None:
    """The path of the CUDA runtime library (libcudart) this process has mapped, if any."""
    for line in maps.read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and "/libcudart.so" in fields[5]:
            return fields[5]
    return None
