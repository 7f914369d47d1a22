"""Layering: the config schema stays torch-free (the operator imports it), the block manager
and scheduler stay tensor-free, and the engine never reaches up into the HTTP server."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).resolve().parents[2] / "worker"


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_config_imports_without_torch() -> None:
    code = "import sys, strata.worker.config; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_block_manager_and_scheduler_are_tensor_free() -> None:
    for name in ("block_manager", "scheduler", "sequence", "prefix_cache", "stats"):
        assert not {m for m in imports_of(WORKER / "engine" / f"{name}.py") if m.split(".")[0] == "torch"}, (
            name
        )


def test_scheduler_block_manager_and_prefix_cache_import_without_torch() -> None:
    """The whole import chain, in a fresh interpreter: not one module on the way loads torch
    (and so none of them can do tier I/O, which lives in kv_tiers)."""
    modules = ", ".join(f"strata.worker.engine.{m}" for m in ("scheduler", "block_manager", "prefix_cache"))
    code = (
        f"import sys, {modules}\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] == 'torch']\n"
        "sys.exit(str(loaded) if loaded else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_scheduling_does_no_tier_io() -> None:
    """Tier calls happen in the step (kv_tiers), never while the scheduler decides."""
    for name in ("scheduler", "prefix_cache", "block_manager"):
        assert "kv_tiers" not in {
            m.rsplit(".", 1)[-1] for m in imports_of(WORKER / "engine" / f"{name}.py")
        }, name


def test_only_kv_tiers_calls_the_connector() -> None:
    for path in (WORKER / "engine").glob("*.py"):
        text = path.read_text()
        if path.name != "kv_tiers.py":
            assert ".connector." not in text and "connector.save" not in text, path.name


def test_engine_and_models_do_not_import_the_server() -> None:
    for folder in ("engine", "models"):
        for path in (WORKER / folder).glob("*.py"):
            bad = {m for m in imports_of(path) if "server" in m or m.startswith("aiohttp")}
            assert not bad, f"{path.name} imports {bad}"
