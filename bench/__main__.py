"""Run the benchmarks named on the command line (default: all) and write JSON results."""

from __future__ import annotations

import importlib
import json
import pkgutil
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"


def available() -> list[str]:
    names = [m.name for m in pkgutil.iter_modules([str(Path(__file__).parent)])]
    return sorted(n.removeprefix("bench_") for n in names if n.startswith("bench_"))


def summarise(name: str, result: dict[str, Any]) -> str:
    summary = result.get("summary")
    if isinstance(summary, str):
        return f"{name}: {summary}"
    scalars = {k: v for k, v in result.items() if isinstance(v, int | float | str)}
    return f"{name}: " + ", ".join(f"{k}={v}" for k, v in list(scalars.items())[:8])


def run_one(name: str) -> dict[str, Any]:
    module = importlib.import_module(f"bench.bench_{name}")
    started = time.time()
    result: dict[str, Any] = module.run()
    result.setdefault("machine", machine())
    result.setdefault("date", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    result.setdefault("elapsed_s", round(time.time() - started, 2))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return result


def machine() -> dict[str, Any]:
    """What ran the benchmark: the CPU's model, how many CPUs it could use, Python's version."""
    return {"cpu": _cpu_model(), "cpus": _cpus(), "python": platform.python_version()}


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


def _cpu_model() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.machine()


def main(argv: list[str]) -> int:
    names = argv or available()
    unknown = sorted(set(names) - set(available()))
    if unknown:
        print(f"bench: unknown benchmark(s) {unknown}; available: {available()}", file=sys.stderr)
        return 2
    for name in names:
        result = run_one(name)
        print(summarise(name, result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
