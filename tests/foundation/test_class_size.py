"""No class in the planes grows past ``MOST_LINES``: a class that large holds several jobs,
and each should be a module of its own (as KVTierService and TierClient were split)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PLANES = ("operator", "worker", "router")
MOST_LINES = 400


def class_sizes() -> dict[str, int]:
    sizes: dict[str, int] = {}
    for plane in PLANES:
        for path in sorted((REPO_ROOT / plane).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                    where = f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.name}"
                    sizes[where] = node.end_lineno - node.lineno + 1
    return sizes


def test_the_planes_have_classes_to_measure() -> None:
    assert len(class_sizes()) > 100


def test_no_class_in_the_planes_is_over_400_lines() -> None:
    large = {where: lines for where, lines in class_sizes().items() if lines > MOST_LINES}
    assert not large, f"classes over {MOST_LINES} lines, split them by job: {large}"
