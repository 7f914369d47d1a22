"""Importing the simulator does not pull in matplotlib: only drawing a plot does. (That it never
reaches torch is pyproject.toml's import-linter contracts'.)"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

IMPORT_SIM = textwrap.dedent(
    """
    import importlib, json, pkgutil, sys
    import strata.sim

    for module in pkgutil.walk_packages(strata.sim.__path__, "strata.sim."):
        if module.name != "strata.sim.plot":
            importlib.import_module(module.name)
    importlib.import_module("strata.sim.plot")  # imports matplotlib only when drawing
    print(json.dumps({"matplotlib": "matplotlib" in sys.modules}))
    """
)


def test_the_simulator_imports_matplotlib_only_to_draw():
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_SIM], capture_output=True, text=True, cwd=REPO_ROOT, check=False
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"matplotlib": False}
