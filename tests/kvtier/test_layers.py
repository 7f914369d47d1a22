"""The sidecar and the policy code stay torch-free: the sidecar process never loads torch (nor
Triton), and the trace simulation runs the sidecar's own policy code without it."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "module",
    [
        "strata.worker.kvtier.simulate",
        "strata.worker.kvtier.server",
        "strata.worker.kvtier.cli",
        "strata.worker.kvtier.xxh3parts",
    ],
)
def test_module_does_not_import_torch_or_triton(module):
    code = f"import sys, {module}; sys.exit('torch' in sys.modules or 'triton' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
