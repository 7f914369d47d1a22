"""Which files the CUDA driver page-locks here: a shared mapping of a file on each file system
named on the command line, registered by ``cudaHostRegister`` as the tier client does, and
whether the runtime's last error is cleared after a refusal. Prints one JSON line a path."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys

import torch

from strata.worker.kvtier import pagelock

SIZE = 64 << 20


def probe(directory: str) -> dict[str, object]:
    path = os.path.join(directory, f"strata-pagelock-probe-{os.getpid()}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, SIZE)
        mapping = mmap.mmap(fd, SIZE)
        buffer = torch.frombuffer(mapping, dtype=torch.uint8)
        error = int(torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), SIZE, 0))
        locked = pagelock.page_lock(buffer, path) if error else True
        torch.zeros(1, device="cuda").add_(1)  # raises if an error were left behind
        if locked:
            pagelock.page_unlock(buffer)
        fs = subprocess.run(["stat", "-f", "-c", "%T", directory], capture_output=True, text=True).stdout
        return {"dir": directory, "fs": fs.strip(), "register_error": error, "launch_after": "ok"}
    finally:
        os.close(fd)
        os.unlink(path)


if __name__ == "__main__":
    torch.zeros(1, device="cuda")
    print(json.dumps({"runtime": pagelock.loaded_runtime(), "kernel": os.uname().release}))
    for directory in sys.argv[1:]:
        print(json.dumps(probe(directory)))
