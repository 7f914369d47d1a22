"""The simulator checked against a real worker: the same small workload through ``strata sim``
(CPU profile) and through a real worker (the ``small`` test model, one torch thread), compared on
TTFT p50 and prefix-hit ratio. The worker is, by default, a pod of an InferenceService that the
operator renders and the local pod runtime runs (``bench.reality_pods``), on a control plane of
the check's own; ``check("process")`` runs a lone ``strata worker serve`` process instead.

The workload is a slice of the Mooncake synthetic trace (40 s where prefixes are often shared)
with every token count divided by 32 (a 512-token trace block becomes one 16-token engine block,
so the trace's prefix sharing becomes real token sharing), its arrivals slowed down until one
CPU worker is busy with prefill about ``TARGET_LOAD`` of the time (by the calibrated profile: on
a slower or busier machine the same check runs at the same load). Each trace block id stands for
16 fixed pseudo-random tokens; a prompt is its blocks' tokens, cut to its length.

The machine is shared and noisy, so the step costs are not taken from another day's figures:
the same worker is calibrated first, through the same HTTP path (lone prompts of several lengths
for prefill, concurrent streams for decode), and ``strata.sim.calibrate.fit`` turns that into the
profile the simulation of the workload then uses. Requests go through the official ``openai``
client; a streamed completion returns its response headers when the first token exists, which
is the TTFT a client sees.

Other processes' load can change between the calibration and the replay: the first runs of this
check on the shared machine measured a real TTFT p50 ten times the simulated one, because the
calibration ran on a quiet machine and the replay on a loaded one (the same replay on a steadier
machine agreed). So the engine's share of a core is measured over both (its thread's CPU time
over its busy wall time, ``strata_worker_engine_busy_seconds_total``), and the calibrated step
costs are stretched by their ratio: the simulation runs the engine at the speed it had during
the replay, and what is compared is the model of scheduling, queueing and caching.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from openai import AsyncOpenAI

from bench.reality_worker import ENGINE_BLOCK, MAX_BATCHED_TOKENS, NUM_GPU_BLOCKS, Worker, worker
from strata.common.traces import traces_dir
from strata.operator.api import ServiceTier
from strata.operator.autoscale.metrics import PodSample, parse_exposition
from strata.sim import trace as traces
from strata.sim.calibrate import Decode, Prefill, StepCosts, fit
from strata.sim.policies.static import Static
from strata.sim.profile import Profile
from strata.sim.profiles import CPU
from strata.sim.report import row
from strata.sim.run import Scenario, simulate
from strata.sim.scenario import load_tiers
from strata.sim.service import ServiceConfig

TRACE = "mooncake_synthetic.jsonl"
Runtime = Literal["pod", "process"]
T = TypeVar("T")
START_S, WINDOW_S = 900.0, 40.0
TOKEN_SCALE = 32  # 512-token trace blocks -> 16-token engine blocks
TARGET_LOAD = 0.35  # share of time the worker spends on prefill, by the calibrated profile
MAX_TIME_SCALE = 6.0  # a machine so busy it would need more runs the check overloaded, and says so
REQUEST_TIMEOUT_S = 300.0
PREFILL_SIZES = (32, 128, 256, 512, 1024, 2048)
CALIBRATION_TRIES = 2
PREFILL_RUNS = 3  # the median of these: a lone prompt's cost, one burst of another process's work aside
DECODE_BATCHES = (1, 4, 8)
DECODE_CONTEXTS = (64, 512)
DECODE_TOKENS = 32
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # the unit of /proc's CPU times


def workload() -> traces.Trace:
    return traces.load(traces_dir() / TRACE).window(START_S, WINDOW_S).scaled(TOKEN_SCALE)


def time_scale(trace: traces.Trace, profile: Profile) -> float:
    busy = sum(profile.lone_prefill_s(r.input_tokens) for r in trace.requests)
    return min(MAX_TIME_SCALE, max(1.0, busy / (WINDOW_S * TARGET_LOAD)))


def prompt_ids(request: traces.Request, block_tokens: int) -> list[int]:
    ids: list[int] = []
    for block in request.blocks:
        rng = random.Random(block)
        ids += [rng.randrange(32, 127) for _ in range(block_tokens)]
    return ids[: request.input_tokens]


def scrape(base: str) -> PodSample:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        return parse_exposition(response.read().decode())


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of each thread of a process, by thread id (Linux /proc)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        out[task.name] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return out


@dataclass(frozen=True)
class Meter:
    """What the worker's engine did between two readings: its busy wall time and its thread's
    CPU time (the thread that used the most: the engine loop's)."""

    busy_s: float
    cpu_s: float

    @property
    def share(self) -> float:
        """The share of a core the engine got while it had work."""
        return self.cpu_s / self.busy_s if self.busy_s > 0 else 1.0


@contextmanager
def metered(w: Worker) -> Iterator[list[Meter]]:
    """Yields a list that holds the reading of the block once it ends."""
    cpu, busy = thread_cpu_s(w.pid), scrape(w.base).engine.get("busy_s", 0.0)
    out: list[Meter] = []
    yield out
    after = thread_cpu_s(w.pid)
    used = max((after[t] - cpu.get(t, 0.0) for t in after), default=0.0)
    out.append(Meter(scrape(w.base).engine.get("busy_s", 0.0) - busy, used))


async def first_token(client: AsyncOpenAI, ids: list[int], max_tokens: int) -> tuple[float, float]:
    """(TTFT, time to the end) of one streamed completion."""
    started = time.perf_counter()
    stream = await client.completions.create(
        model="small",
        prompt=ids,
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    ttft = time.perf_counter() - started
    async for _ in stream:
        pass
    return ttft, time.perf_counter() - started


def fresh(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(32, 127) for _ in range(n)]


async def calibrate_prefill(client: AsyncOpenAI, seed: int = 1) -> list[Prefill]:
    """Lone prompts of each size: the median TTFT of a few (the share of a core the engine gets
    meanwhile is metered around all of them, so a middle run, not the luckiest, goes with it)."""
    rng, prefills = random.Random(seed), []
    for n in PREFILL_SIZES:
        runs = [(await first_token(client, fresh(rng, n), 1))[0] for _ in range(PREFILL_RUNS)]
        prefills.append(Prefill(n, statistics.median(runs)))
    return prefills


async def calibrate_decode(client: AsyncOpenAI, seed: int = 2) -> list[Decode]:
    """Concurrent streams: the median time per generated token of each batch."""
    rng, decodes = random.Random(seed), []
    for context in DECODE_CONTEXTS:
        for batch in DECODE_BATCHES:
            runs = await asyncio.gather(
                *(first_token(client, fresh(rng, context), DECODE_TOKENS) for _ in range(batch))
            )
            per_token = statistics.median((end - ttft) / (DECODE_TOKENS - 1) for ttft, end in runs)
            decodes.append(Decode(batch, context, per_token))
    return decodes


async def replay(client: AsyncOpenAI, trace: traces.Trace) -> list[float | None]:
    """Send every request at its arrival time; the TTFT of each (None where it failed)."""
    start = time.perf_counter() + 1.0

    async def one(request: traces.Request) -> float | None:
        await asyncio.sleep(max(0.0, start + request.arrival_s - time.perf_counter()))
        try:
            ttft, _ = await first_token(
                client, prompt_ids(request, trace.block_tokens), request.output_tokens
            )
        except Exception:  # a refusal (429) or an error counts as no TTFT; the rest goes on
            return None
        return ttft

    bound = trace.span_s + REQUEST_TIMEOUT_S  # the replay's length plus the slowest request's
    results = await asyncio.wait_for(asyncio.gather(*(one(r) for r in trace.requests)), bound)
    return list(results)


def profile_from(costs: StepCosts, slowdown: float = 1.0) -> Profile:
    """The CPU profile with the calibrated step costs, each ``slowdown`` times longer."""
    return CPU.model_copy(
        update={
            "name": "cpu-calibrated",
            "kv_cache_bytes": NUM_GPU_BLOCKS * ENGINE_BLOCK * CPU.kv_bytes_per_token,
            "max_batched_tokens": MAX_BATCHED_TOKENS,
            "overhead_s": costs.overhead_s * slowdown,
            "floor_s": 0.0,
            "prefill_token_s": costs.prefill_token_s * slowdown,
            "attention_pair_s": costs.attention_pair_s * slowdown,
            "decode_seq_s": costs.decode_seq_s * slowdown,
            "decode_context_token_s": costs.decode_context_token_s * slowdown,
            "request_overhead_s": costs.request_overhead_s * slowdown,
        }
    )


def hbm_only_tier() -> ServiceTier:
    """The standard tier without lower tiers: the real worker runs without its sidecar."""
    raw = load_tiers()["standard"].model_dump(by_alias=True)
    raw["spec"]["cache"]["dram"]["defaultSize"] = "0"
    raw["spec"]["cache"]["nvme"]["defaultSize"] = "0"
    raw["spec"]["cache"]["shared"]["enabled"] = False
    return ServiceTier.model_validate(raw)


def simulated(trace: traces.Trace, profile: Profile) -> dict[str, Any]:
    config = ServiceConfig("reality", "standard", trace, min_replicas=1, max_replicas=1, replicas=1)
    scenario = Scenario((config,), {"standard": hbm_only_tier()}, profile, gpus=1, router="random")
    result = simulate(scenario, "static", lambda s: Static("static", 1, "one real worker"))
    items = result.services[0].outcomes.items
    figures = row(result.services[0])
    return {
        "ttft_s": [o.ttft_s for o in items],
        "hit_ratio": round(sum(figures["hit_ratio"].values()), 4),
        "wall_s": round(result.wall_s, 2),
    }


def hit_ratio(before: PodSample, after: PodSample) -> float:
    prompt = after.prompt_tokens - before.prompt_tokens
    hits = sum(after.prefix_hit_tokens.values()) - sum(before.prefix_hit_tokens.values())
    return round(hits / prompt, 4) if prompt else 0.0


def p50(values: Sequence[float | None]) -> float | None:
    served = sorted(v for v in values if v is not None)
    return round(statistics.median(served), 4) if served else None


@dataclass(frozen=True)
class Real:
    """The real worker's side of the check."""

    trace: traces.Trace
    costs: StepCosts
    calibration: Meter
    replay: Meter
    ttft_s: list[float | None]
    hit_ratio: float
    replay_s: float
    raw: dict[str, Any]

    @property
    def slowdown(self) -> float:
        """How much slower the engine ran during the replay than while its prefills were
        calibrated (decode streams share the worker's event loop; their steps are not metered)."""
        return self.calibration.share / self.replay.share


def client(w: Worker) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{w.base}/v1", api_key="unused", timeout=REQUEST_TIMEOUT_S, max_retries=0)


def run_with(w: Worker, work: Callable[[AsyncOpenAI], Awaitable[T]]) -> T:
    """``work`` on an event loop of its own with a client of its own, closed before the loop is:
    pooled connections belong to the loop that opened them (reused from a closed loop, the
    replay's first requests failed with 'Event loop is closed'; left to the garbage collector,
    their closing did, on stderr)."""

    async def main() -> T:
        async with client(w) as c:
            return await work(c)

    return asyncio.run(main())


@dataclass(frozen=True)
class Calibration:
    costs: StepCosts
    meter: Meter  # around the prefills: what sets the pace of the replay's TTFTs
    prefills: list[Prefill]
    decodes: list[Decode]


def calibrate(w: Worker) -> Calibration:
    """The worker's step costs, after one warm-up prompt (a fresh engine's first steps pay
    one-off costs). A burst of other work during the lone prompts can leave timings with no
    per-token cost in them: the calibration is then run again, up to ``CALIBRATION_TRIES``."""
    run_with(w, lambda c: first_token(c, fresh(random.Random(0), PREFILL_SIZES[0]), 1))
    for attempt in range(1, CALIBRATION_TRIES + 1):
        with metered(w) as calibrating:
            prefills = run_with(w, functools.partial(calibrate_prefill, seed=attempt))
        decodes = run_with(w, calibrate_decode)
        try:
            return Calibration(fit(decodes, prefills, MAX_BATCHED_TOKENS), calibrating[0], prefills, decodes)
        except ValueError:
            if attempt == CALIBRATION_TRIES:
                raise
    raise AssertionError("unreachable: the last try returns or raises")


def measure(w: Worker) -> Real:
    """Calibrate the worker, then replay the workload through it."""
    calibration = calibrate(w)
    costs, prefills, decodes = calibration.costs, calibration.prefills, calibration.decodes
    trace = workload().retimed(time_scale(workload(), profile_from(costs)))
    before, started = scrape(w.base), time.perf_counter()
    with metered(w) as replaying:
        measured = run_with(w, lambda c: replay(c, trace))
    replay_s = time.perf_counter() - started
    raw = {"prefill": [p.__dict__ for p in prefills], "decode": [d.__dict__ for d in decodes]}
    hits = hit_ratio(before, scrape(w.base))
    return Real(trace, costs, calibration.meter, replaying[0], measured, hits, replay_s, raw)


def check(on: Runtime = "pod") -> dict[str, Any]:
    """Calibrate, replay through the real worker (``on`` a pod of the local pod runtime, or a
    lone process), simulate the same; the comparison."""
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as directory, real_worker(on, Path(directory)) as w:
        real = measure(w)
    sim = simulated(real.trace, profile_from(real.costs, real.slowdown))
    uncorrected = simulated(real.trace, profile_from(real.costs))
    return {"worker": on, **comparison(real, sim, uncorrected, (load_before, os.getloadavg()[0]))}


@contextmanager
def real_worker(on: Runtime, directory: Path) -> Iterator[Worker]:
    if on == "pod":
        from bench.reality_pods import own_cluster_worker  # the control plane: only for pods

        with own_cluster_worker(directory) as w:
            yield w
        return
    from strata.worker.models.presets import write_model  # torch: only for the lone process

    write_model(directory, "small")
    with worker(directory) as w:
        yield w


def comparison(
    real: Real, sim: dict[str, Any], uncorrected: dict[str, Any], loads: tuple[float, float]
) -> dict[str, Any]:
    real_p50, sim_p50 = p50(real.ttft_s), p50(sim["ttft_s"])
    ratio = round(sim_p50 / real_p50, 3) if real_p50 and sim_p50 else None
    meters = {"calibration": real.calibration.__dict__, "replay": real.replay.__dict__}
    return {
        "workload": {
            "trace": TRACE,
            "start_s": START_S,
            "window_s": WINDOW_S,
            "token_scale": TOKEN_SCALE,
            "time_scale": round(real.trace.span_s / workload().span_s, 2),
            "requests": len(real.trace.requests),
            "replay_s": round(real.replay_s, 1),
        },
        "calibration": {"step_costs": real.costs.__dict__, **real.raw},
        "engine_share_of_a_core": {k: round(Meter(**v).share, 3) for k, v in meters.items()},
        "slowdown_applied": round(real.slowdown, 3),
        "load_average_1m": {"before": round(loads[0], 2), "after": round(loads[1], 2)},
        "real": {"ttft_p50_s": real_p50, "hit_ratio": real.hit_ratio, "failed": real.ttft_s.count(None)},
        "simulated": {"ttft_p50_s": sim_p50, "hit_ratio": sim["hit_ratio"], "wall_s": sim["wall_s"]},
        "simulated_without_slowdown": {"ttft_p50_s": p50(uncorrected["ttft_s"])},
        "ttft_p50_sim_over_real": ratio,
        "hit_ratio_difference": round(abs(sim["hit_ratio"] - real.hit_ratio), 4),
        "agrees": ratio is not None
        and abs(ratio - 1) <= 0.25
        and abs(sim["hit_ratio"] - real.hit_ratio) <= 0.05,
    }
