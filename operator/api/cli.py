"""``strata crds generate|check``: write the generated API files, or fail when they are stale."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from strata.operator.api import generate


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="strata crds", description=__doc__)
    parser.add_argument("action", choices=["generate", "check"])
    parser.add_argument("--root", type=Path, default=generate.REPO_ROOT, help="repository root")
    args = parser.parse_args(argv)
    if args.action == "generate":
        changed = generate.write(args.root)
        for path in changed:
            print(f"wrote {path}")
        print(f"{len(changed)} file(s) changed")
        return 0
    lines = generate.diff(args.root)
    if lines:
        sys.stdout.writelines(lines)
        print("\ngenerated API files are stale: run `make crds` and commit the result", file=sys.stderr)
        return 1
    print("generated API files are current")
    return 0
