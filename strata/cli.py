"""The single ``strata`` command. Each subcommand lives in its own module, imported only
when it runs, so ``strata operator`` never pulls the worker's torch into the operator."""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module with `main(argv: list[str]) -> int`, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "cluster": ("strata.cluster.cli", "start/stop a local control plane with fake GPU nodes"),
    "crds": ("strata.operator.api.cli", "generate the CRDs and admission policy from the API models"),
    "operator": ("strata.operator.cli", "run the InferenceService operator"),
    "worker": ("strata.worker.cli", "run the inference worker, or make a test model"),
    "kvtier": ("strata.worker.kvtier.cli", "run the tiered KV-cache sidecar"),
    "router": ("strata.router.cli", "run the cache-aware router in front of a service's workers"),
    "demo": ("strata.demo.cli", "bring up the local platform end to end and show it working"),
    "sim": ("strata.sim.cli", "replay traces through a simulated fleet and compare autoscalers"),
}


def usage() -> str:
    lines = ["usage: strata <command> [args...]", "", "commands:"]
    lines += [f"  {name:<10} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"strata: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    result: int = module.main(rest)
    return result


if __name__ == "__main__":
    sys.exit(main())
