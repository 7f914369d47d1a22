"""Packaging invariants: nothing we ship shadows the standard library. (That the operator and the
router never import torch is pyproject.toml's import-linter contracts'.)"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_distribution_ships_only_the_strata_top_level_package() -> None:
    top_level = importlib.metadata.distribution("strata").read_text("top_level.txt") or ""
    names = set(top_level.split())
    assert names == {"strata"}
    assert not names & sys.stdlib_module_names


def test_import_operator_gives_the_standard_library_from_the_repo_root() -> None:
    # `python -c` (and `-m`) put the current directory first on sys.path, and the repository has
    # an operator/ folder (imported as strata.operator). Without `site` (-S), nothing imports the
    # stdlib `operator` before that happens, as in a fresh venv with no .pth files: the folder
    # must still lose, which it does because it has no __init__.py (a namespace portion loses to
    # a module found later on the path).
    assert not (REPO_ROOT / "operator" / "__init__.py").exists()
    result = subprocess.run(
        [sys.executable, "-S", "-c", "import operator; print(operator.__file__)"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=True,
    )
    assert Path(result.stdout.strip()).parent == Path(sysconfig.get_paths()["stdlib"])
