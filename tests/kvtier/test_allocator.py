"""The sidecar's allocator thresholds: with them fixed, large blocks freed leave the process's
RSS even after a larger one freed before (which raises glibc's own threshold above them)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

MiB = 1 << 20

PROBE = """
import sys
from strata.worker.kvtier import allocator

def anon():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon:"))

if sys.argv[1] == "fixed":
    assert allocator.fix_thresholds()
big = bytearray(8 << 20)
del big  # glibc by itself now serves blocks under 8 MiB from its heap
before = anon()
held = [bytearray(1 << 20) for _ in range(48)]
pin = bytearray(200 << 10)  # a block above them on the heap: the heap cannot shrink past it
for block in held:
    block[::4096] = b"\\x01" * len(range(0, len(block), 4096))
del held
print(anon() - before)
"""


def grown(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip())


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator thresholds")
def test_fixed_thresholds_give_freed_large_blocks_back():
    # Without them the 48 MiB stay (glibc 2.36 here); with them about 1 MiB does.
    assert grown("fixed") < 8 * MiB
