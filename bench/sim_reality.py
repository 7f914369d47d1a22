"""The simulator checked against a real worker: the same small workload through ``strata sim``
(CPU profile) and through a real ``strata worker serve`` process (the ``small`` test model, one
torch thread), compared on TTFT p50 and prefix-hit ratio.

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
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from strata.operator.api import ServiceTier
from strata.operator.autoscale.metrics import PodSample, parse_exposition
from strata.sim import trace as traces
from strata.sim.calibrate import Decode, Prefill, StepCosts, fit
from strata.sim.policies.static import Static
from strata.sim.profile import Profile
from strata.sim.profiles import CPU
from strata.sim.report import row
from strata.sim.run import Scenario, simulate
from strata.sim.scenario import TRACES_DIR, load_tiers
from strata.sim.service import ServiceConfig

TRACE = "mooncake_synthetic.jsonl"
START_S, WINDOW_S = 900.0, 40.0
TOKEN_SCALE = 32  # 512-token trace blocks -> 16-token engine blocks
TARGET_LOAD = 0.35  # share of time the worker spends on prefill, by the calibrated profile
MAX_TIME_SCALE = 6.0  # a machine so busy it would need more runs the check overloaded, and says so
ENGINE_BLOCK = 16
NUM_GPU_BLOCKS = 2048  # 32k tokens of KV: a few dozen prompts, so the cache evicts
MAX_BATCHED_TOKENS = 2048
READY_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 300.0
PREFILL_SIZES = (32, 128, 256, 512, 1024, 2048)
PREFILL_RUNS = 3  # the fastest of these: a lone prompt's cost without another process's burst
DECODE_BATCHES = (1, 4, 8)
DECODE_CONTEXTS = (64, 512)
DECODE_TOKENS = 32
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # the unit of /proc's CPU times


def workload() -> traces.Trace:
    return traces.load(TRACES_DIR / TRACE).window(START_S, WINDOW_S).scaled(TOKEN_SCALE)


def time_scale(trace: traces.Trace, profile: Profile) -> float:
    busy = sum(profile.lone_prefill_s(r.input_tokens) for r in trace.requests)
    return min(MAX_TIME_SCALE, max(1.0, busy / (WINDOW_S * TARGET_LOAD)))


def prompt_ids(request: traces.Request, block_tokens: int) -> list[int]:
    ids: list[int] = []
    for block in request.blocks:
        rng = random.Random(block)
        ids += [rng.randrange(32, 127) for _ in range(block_tokens)]
    return ids[: request.input_tokens]


@dataclass(frozen=True)
class Worker:
    base: str  # URL
    pid: int


@contextmanager
def worker(model_dir: str) -> Iterator[Worker]:
    """A real worker process on a free loopback port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = Path(model_dir) / "worker.yaml"
    config.write_text(
        f"model: {{name: small, path: {model_dir}, max_context_tokens: 8192}}\n"
        f"engine: {{device: cpu, cpu_threads: 1, block_size: {ENGINE_BLOCK},"
        f" num_gpu_blocks: {NUM_GPU_BLOCKS},"
        f" max_batched_tokens: {MAX_BATCHED_TOKENS}}}\n"
        f"server: {{host: 127.0.0.1, port: {port}}}\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "strata", "worker", "serve", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base, process)
        yield Worker(base, process.pid)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def _wait_ready(base: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"reality check: the worker exited with status {process.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/ready", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"reality check: the worker was not ready within {READY_TIMEOUT_S:.0f} s")


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
    """A client for one event loop: its pooled connections belong to the loop that opened them
    (reused from a closed one, the replay's first requests failed with 'Event loop is closed')."""
    return AsyncOpenAI(base_url=f"{w.base}/v1", api_key="unused", timeout=REQUEST_TIMEOUT_S, max_retries=0)


def measure(w: Worker) -> Real:
    """Calibrate the worker, then replay the workload through it."""
    with metered(w) as calibrating:  # the prefills: what sets the pace of the replay's TTFTs
        prefills = asyncio.run(calibrate_prefill(client(w)))
    decodes = asyncio.run(calibrate_decode(client(w)))
    costs = fit(decodes, prefills, MAX_BATCHED_TOKENS)
    trace = workload().retimed(time_scale(workload(), profile_from(costs)))
    before, started = scrape(w.base), time.perf_counter()
    with metered(w) as replaying:
        measured = asyncio.run(replay(client(w), trace))
    replay_s = time.perf_counter() - started
    raw = {"prefill": [p.__dict__ for p in prefills], "decode": [d.__dict__ for d in decodes]}
    hits = hit_ratio(before, scrape(w.base))
    return Real(trace, costs, calibrating[0], replaying[0], measured, hits, replay_s, raw)


def check() -> dict[str, Any]:
    """Calibrate, replay through the real worker, simulate the same; the comparison."""
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as model_dir:
        from strata.worker.models.presets import write_model  # torch: only for the real worker

        write_model(model_dir, "small")
        with worker(model_dir) as w:
            real = measure(w)
    sim = simulated(real.trace, profile_from(real.costs, real.slowdown))
    uncorrected = simulated(real.trace, profile_from(real.costs))
    return comparison(real, sim, uncorrected, (load_before, os.getloadavg()[0]))


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
