"""Chaos benchmark: what a service's clients see when parts of the platform fail under load.

On the test control plane's local node (real pods, real routers; ``chaos_platform``) a steady
load of streamed completions at temperature 0 (``chaos_load``) runs through the Service's
ClusterIP at ``LOAD_SHARE`` of one replica's measured throughput, so that one replica can carry
it alone while the other recovers. First a reference pass (each prompt once, nothing failing)
and a quiet row (``none``) give the answers and the hit ratio to compare with; then each fault
(``chaos_faults``), one at a time, and last a mixed run: the load runs ``LEAD_S`` before the
fault, until the platform is healthy again, and ``TAIL_S`` after. Each row counts what the
clients saw (``chaos_outcome``): answered, refused with Retry-After, lost, cut, wrong output,
corrupt blocks served, and the seconds until the service was Ready and back to its hit ratio.

``python -m bench chaos`` runs every fault; ``python -m bench.bench_chaos --faults engine,burst``
(or ``STRATA_CHAOS_FAULTS``) a few, into the same ``bench/results/chaos.json``.
Shape: ``{"rows": [ROW...], "replica_throughput_per_s", "rate_per_s", "skipped": {FAULT: WHY}}``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from bench import chaos_faults, chaos_load, chaos_outcome
from bench.chaos_outcome import Response, Row
from bench.chaos_platform import Platform, platform_up, wait_healthy, wait_unhealthy

LOAD_SHARE = 0.6  # of one replica's throughput: one replica carries it while the other recovers
MEASURE_S = 15.0
LEAD_S = 8.0
TAIL_S = 20.0
QUIET_S = 30.0
RECOVER_S = 600.0  # a bound: a replaced pod imports torch and loads the model
NOTICED_S = 20.0  # a kill the platform has not noticed by then: it recovered before it showed
CORRUPT_METRIC = "strata_kvtier_corrupt_blocks_total"


def measure_throughput(url: str, pool: Sequence[Sequence[int]]) -> float:
    """Completions per second through the service, 4 clients in a closed loop, over both
    replicas; one replica's share is half."""

    async def loop() -> int:
        done = 0
        deadline = time.monotonic() + MEASURE_S
        async with chaos_load.new_client(8) as client:

            async def one(k: int) -> None:
                nonlocal done
                while time.monotonic() < deadline:
                    r = await chaos_load.send(client, url, pool, k % len(pool), time.monotonic())
                    done += chaos_outcome.classify(r) is chaos_outcome.Kind.ANSWERED
                    k += 1

            await asyncio.gather(*(one(k) for k in range(4)))
        return done

    answered = asyncio.run(loop())
    if answered == 0:
        raise RuntimeError(f"chaos: {url} answered nothing in {MEASURE_S:.0f} s")
    return answered / MEASURE_S / 2


def reference(url: str, pool: Sequence[Sequence[int]]) -> dict[int, str]:
    """Each prompt's answer at temperature 0 with nothing failing (the second of two passes,
    so both come from a warm cache as most of the load's do)."""
    out: dict[int, str] = {}

    async def passes() -> None:
        async with chaos_load.new_client(1) as client:
            for _ in range(2):
                for i in range(len(pool)):
                    r = await chaos_load.send(client, url, pool, i, time.monotonic())
                    if chaos_outcome.classify(r) is not chaos_outcome.Kind.ANSWERED:
                        raise RuntimeError(f"chaos: reference request {i} failed: {r.error or r.status}")
                    out[i] = r.text

    asyncio.run(passes())
    return out


def corrupt_caught(before: Mapping[str, float], after: Mapping[str, float]) -> int:
    """Blocks the tiers' checks caught since ``before``, per pod (a new pod counts from 0)."""
    return int(sum(max(0.0, v - before.get(uid, 0.0)) for uid, v in after.items()))


class Run:
    """One benchmark run on one platform: the reference, the quiet row, then the faults."""

    def __init__(self, platform: Platform) -> None:
        self.platform, self.pool = platform, chaos_load.prompt_pool()
        self.url = platform.url()
        self.t0 = time.monotonic()
        self.replica_rate = measure_throughput(self.url, self.pool)
        self.rate = max(0.5, LOAD_SHARE * self.replica_rate)
        self.reference = reference(self.url, self.pool)
        self.steady_hit: float | None = None
        self.notes: dict[str, str] = {}

    def now(self) -> float:
        return time.monotonic() - self.t0

    def quiet(self) -> Row:
        load = chaos_load.SteadyLoad(self.url, self.pool, self.rate, self.t0).start()
        time.sleep(QUIET_S)
        responses = load.stop()
        row = chaos_outcome.row("none", responses, self.reference, 0, 0.0)
        self.steady_hit = row.hit_ratio
        return row

    def fault(self, name: str) -> Row:
        wait_healthy(self.platform, RECOVER_S)
        load = chaos_load.SteadyLoad(self.url, self.pool, self.rate, self.t0).start()
        injected = chaos_faults.Injected()
        try:
            time.sleep(LEAD_S)
            counters = self.platform.sidecar_metric(CORRUPT_METRIC)
            warnings = self.platform.warnings()
            fault_s = self.now()
            injected = chaos_faults.FAULTS[name](self.platform, self.t0)
            if injected.disrupts:
                wait_unhealthy(self.platform, NOTICED_S)
            ready_s = self._recovered()
            time.sleep(TAIL_S)
            caught = corrupt_caught(counters, self.platform.sidecar_metric(CORRUPT_METRIC))
            told = sorted(set(self.platform.warnings()) - set(warnings))
        finally:
            responses = load.stop() + injected.responses
            injected.undo()
        note = "; ".join(x for x in (injected.note, f"Warning Events: {', '.join(told) or 'none'}") if x)
        return self._row(name, responses, fault_s, ready_s, caught, note)

    def _recovered(self) -> float | None:
        try:
            return wait_healthy(self.platform, RECOVER_S) - self.t0
        except AssertionError:
            return None

    def _row(
        self,
        name: str,
        responses: list[Response],
        fault_s: float,
        ready_s: float | None,
        caught: int,
        note: str,
    ) -> Row:
        recovery = chaos_outcome.recovery_s(responses, fault_s, ready_s, self.steady_hit)
        row = chaos_outcome.row(name, responses, self.reference, 0, recovery)
        if name == "nvme-corrupt":  # a corrupt block that got past the checks is a wrong answer
            row = chaos_outcome.Row(**{**row.__dict__, "corrupt_served": row.wrong_output})
        self.notes[name] = "; ".join(x for x in (note, f"{caught} corrupt blocks caught by the checks") if x)
        return row


def selected(argv: Sequence[str]) -> list[str]:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_chaos")
    parser.add_argument("--faults", default=os.environ.get("STRATA_CHAOS_FAULTS", ""))
    names = [n for n in parser.parse_args(argv).faults.split(",") if n] or list(chaos_faults.FAULTS)
    unknown = sorted(set(names) - set(chaos_faults.FAULTS))
    if unknown:
        parser.error(f"unknown faults {unknown}; known: {', '.join(chaos_faults.FAULTS)}")
    return names


def run(argv: Sequence[str] = ()) -> dict[str, Any]:
    names = selected(argv)
    rows: list[Row] = []
    skipped: dict[str, str] = {}
    with platform_up() as platform:
        bench = Run(platform)
        rows.append(bench.quiet())
        for name in names:
            print(f"chaos: {name} ...", flush=True)
            try:
                rows.append(bench.fault(name))
            except chaos_faults.Skipped as why:
                skipped[name] = str(why)
            print("\n".join(chaos_outcome.table(rows[-1:])), flush=True)
    table = chaos_outcome.table(rows)
    print("\n".join(table), flush=True)
    return {
        "rows": [r.as_json() for r in rows],
        "notes": bench.notes,
        "skipped": skipped,
        "replica_throughput_per_s": round(bench.replica_rate, 3),
        "rate_per_s": round(bench.rate, 3),
        "load_share": LOAD_SHARE,
        "summary": summary(rows),
        "table": table,
    }


def summary(rows: Sequence[Row]) -> str:
    faults = [r for r in rows if r.fault != "none"]
    bad = sum(r.lost + r.wrong_output + r.corrupt_served for r in faults)
    slowest = max((r.recovery_s or 0.0 for r in faults), default=0.0)
    return (
        f"{len(faults)} faults, {sum(r.sent for r in faults)} requests: {sum(r.lost for r in faults)} lost, "
        f"{sum(r.cut for r in faults)} cut, {sum(r.wrong_output for r in faults)} wrong, "
        f"{sum(r.corrupt_served for r in faults)} corrupt served ({bad} in all); "
        f"not back: {[r.fault for r in faults if r.recovery_s is None]}; slowest recovery {slowest:.0f} s"
    )


def main(argv: Sequence[str]) -> int:
    """``--faults a,b``: only those, through ``python -m bench chaos`` (same JSON, same summary)."""
    from bench.__main__ import main as bench_main

    os.environ["STRATA_CHAOS_FAULTS"] = ",".join(selected(argv))
    return bench_main(["chaos"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
