"""``strata crds generate|check|apply``: write the generated API files, fail when they are stale,
or server-side apply the CRDs to a cluster (the chart's pre-upgrade hook)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from strata.operator.api import generate


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="strata crds", description=__doc__)
    parser.add_argument("action", choices=["generate", "check", "apply"])
    parser.add_argument("--root", type=Path, default=generate.REPO_ROOT, help="repository root")
    parser.add_argument("--kubeconfig", help="apply: kubeconfig (default: in-cluster, then $KUBECONFIG)")
    args = parser.parse_args(argv)
    if args.action == "apply":
        # Imported here: the API layer itself never talks to a cluster.
        from strata.operator import crdapply

        return crdapply.main(args.kubeconfig)
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
