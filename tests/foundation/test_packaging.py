"""Packaging invariants: the operator and the router never import torch; nothing we ship shadows the
standard library."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]

# Imports every module of a package (and the CLI), then reports which heavy modules came along.
# Run in a fresh interpreter: this test process may already have torch from other tests.
IMPORT_GRAPH = textwrap.dedent(
    """
    import importlib, json, pkgutil, sys
    import strata.cli, strata.worker.config
    package = importlib.import_module(sys.argv[1])

    def fail(name):
        raise ImportError(f"cannot import {name}")

    for module in pkgutil.walk_packages(package.__path__, sys.argv[1] + ".", onerror=fail):
        importlib.import_module(module.name)
    print(json.dumps({"torch": "torch" in sys.modules, "modules": sorted(sys.modules)}))
    """
)


def import_graph(package: str) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, "-c", IMPORT_GRAPH, package],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def test_operator_import_graph_never_pulls_in_torch() -> None:
    report = import_graph("strata.operator")
    assert "strata.worker.config" in report["modules"]
    assert report["torch"] is False, "the operator's import graph pulled in torch"


def test_router_import_graph_never_pulls_in_torch() -> None:
    """The router validates and hashes requests with the worker's own code, without its engine."""
    report = import_graph("strata.router")
    assert "strata.router.choose" in report["modules"]
    assert report["torch"] is False, "the router's import graph pulled in torch"


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
