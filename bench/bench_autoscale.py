"""Autoscaling policies side by side with ``strata sim`` on both shared traces and both profiles:
a premium chat service and a batch job sharing a GPU budget (docs/autoscaling.md).

``{TRACE: {PROFILE: {POLICY: {"slo_attainment": {TIER: x}, "replica_seconds": y, ...}}}}`` plus:
``criteria`` (the issue's bar, evaluated on conversation/gpu), ``tuning`` (the builtin autoscaler
with other premium settings: how the default tiers were chosen), ``kpa_targets`` (the KPA's one
free knob swept), ``startup_sweep`` (the builtin autoscaler with pod start-up 30 s to 5 min),
``speed`` (a one-hour trace on 8 replicas: simulated seconds per wall and per CPU second) and
``reality`` (the simulator against a real worker, bench/sim_reality.py). Plots:
bench/results/autoscale-<trace>-<profile>.png.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench import sim_reality
from strata.operator.api.generate import EXAMPLE_TIERS
from strata.sim.compare import Comparison, compare, plot
from strata.sim.policies.catalog import DYNAMIC, POLICIES, Knobs
from strata.sim.policies.static import Static
from strata.sim.run import simulate
from strata.sim.scenario import REPO, ScenarioFile, ServiceEntry, build

RESULTS = Path(__file__).parent / "results"
TRACES = {"conversation": "mooncake_conversation.jsonl", "synthetic": "mooncake_synthetic.jsonl"}
# The CPU profile's `small` model prefills ~13x slower per token than an H100 runs an 8B model:
# its runs replay the same requests with every token count divided by 16 (blocks of 32 tokens).
TOKEN_SCALE = {"gpu": 1, "cpu": 16}
GPUS = 24
STARTUPS_S = (30.0, 60.0, 120.0, 300.0)
SPEED_REPLICAS = 8
KPA_TARGETS = (2.0, 4.0, 8.0)
# Premium settings tried against the shipped ones: (targetPrefillUtilization, scale-up window,
# scale-down window). The first is the tier's former windows.
PREMIUM_VARIANTS = ((0.15, 0, 600), (0.15, 30, 300), (0.2, 30, 300), (0.3, 30, 300))


def scenario(trace: str, profile: str, startup_s: float | None = None) -> ScenarioFile:
    """Premium chat replays the whole trace; a batch job of ten minutes of the same trace,
    submitted in five, arrives a third of the way in (and needs its replicas woken from zero)."""
    name = TRACES[trace]
    spread = 3.0 if trace == "conversation" else 0.0  # that trace records arrivals in 3 s slots
    span = {"conversation": 3537.0, "synthetic": 1022.0}[trace]
    common = {"trace": name, "token_scale": TOKEN_SCALE[profile], "spread_s": spread, "max_replicas": 16}
    chat = ServiceEntry(name="chat", tier="premium", replicas=4, **common)
    jobs = ServiceEntry(
        name="jobs",
        tier="batch",
        duration_s=600.0,
        time_scale=0.5,
        offset_s=round(span / 3),
        min_replicas=0,
        replicas=0,
        **common,
    )
    return ScenarioFile(profile=profile, gpus=GPUS, startup_s=startup_s, services=[chat, jobs])


def figures(comparison: Comparison) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for run in comparison.summaries:
        services = run["services"].values()
        out[run["policy"]] = {
            "slo_attainment": {s["tier"]: s["slo_attainment"] for s in services},
            "replica_seconds": run["replica_seconds"],
            "attainable": {s["tier"]: s["attainable"] for s in services},
            "attainment_of_attainable": {s["tier"]: s["attainment_of_attainable"] for s in services},
            "ttft_p95_s": {s["tier"]: s["ttft_s"]["p95"] for s in services},
            "replica_seconds_by_tier": {s["tier"]: s["replica_seconds"] for s in services},
            "scaling_events": {s["tier"]: s["scaling_events"] for s in services},
            "refused": {s["tier"]: s["refused"] + s["unfinished"] for s in services},
            "hit_ratio": {s["tier"]: s["hit_ratio"] for s in services},
            "pod_preemptions": {s["tier"]: s["pod_preemptions"] for s in services},
            "wall_s": run["wall_s"],
        }
    out["static_sizes"] = comparison.static
    return out


def criteria(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's bar on conversation/gpu: premium within its TTFT target for >= 99% of
    requests at <= 0.6x static peak's replica-seconds, and better than every other dynamic
    policy at equal or lower replica-seconds. Attainment is given both over all requests and
    over those whose lone TTFT can meet the target at all."""
    runs = results["conversation"]["gpu"]
    builtin, peak = runs["builtin"], runs["static_peak"]
    peers = {}
    for name in DYNAMIC:
        if name != "builtin":
            peer = runs[name]
            peers[name] = {
                "premium_attainment_higher": builtin["slo_attainment"]["premium"]
                > peer["slo_attainment"]["premium"],
                "replica_seconds_not_higher": builtin["replica_seconds"] <= peer["replica_seconds"],
            }
    return {
        "premium_slo_attainment": builtin["slo_attainment"]["premium"],
        "premium_attainment_of_attainable": builtin["attainment_of_attainable"]["premium"],
        "premium_attainable": builtin["attainable"]["premium"],
        "replica_seconds_over_static_peak": round(builtin["replica_seconds"] / peak["replica_seconds"], 3),
        "versus_dynamic_peers": peers,
    }


def tuning() -> dict[str, Any]:
    out = {}
    for target, up, down in PREMIUM_VARIANTS:
        with tempfile.TemporaryDirectory() as folder:
            _tiers_with(Path(folder), target, up, down)
            spec = scenario("conversation", "gpu").model_copy(update={"tiers": folder})
            result = compare(build(spec), ["builtin"])
        out[f"target {target}, windows {up}/{down} s"] = figures(result)["builtin"]
    return out


def _tiers_with(folder: Path, target: float, up: int, down: int) -> None:
    for path in (REPO / EXAMPLE_TIERS).glob("*.yaml"):
        tier = yaml.safe_load(path.read_text())
        if tier["metadata"]["name"] == "premium":
            auto = tier["spec"]["autoscaling"]
            auto["targetPrefillUtilization"] = target
            auto["scaleUpStabilizationSeconds"] = up
            auto["scaleDownStabilizationSeconds"] = down
        (folder / path.name).write_text(yaml.safe_dump(tier))


def kpa_targets() -> dict[str, Any]:
    out = {}
    for target in KPA_TARGETS:
        result = compare(build(scenario("conversation", "gpu")), ["kpa"], Knobs(kpa_default_target=target))
        out[f"{target:g}"] = figures(result)["kpa"]
    return out


def startup_sweep() -> dict[str, Any]:
    sweep = {}
    for startup in STARTUPS_S:
        result = compare(build(scenario("conversation", "gpu", startup)), ["builtin"])
        sweep[f"{startup:.0f}"] = figures(result)["builtin"]
    return sweep


def speed() -> dict[str, Any]:
    """The one-hour conversation trace through 8 static replicas of the GPU profile."""
    spec = ScenarioFile(
        profile="gpu",
        gpus=SPEED_REPLICAS,
        services=[
            ServiceEntry(
                name="chat",
                tier="premium",
                trace=TRACES["conversation"],
                spread_s=3.0,
                replicas=SPEED_REPLICAS,
                max_replicas=SPEED_REPLICAS,
            )
        ],
    )
    result = simulate(build(spec), "static", lambda s: Static("static", SPEED_REPLICAS, "speed"))
    return {
        "replicas": SPEED_REPLICAS,
        "requests": len(result.services[0].outcomes.items),
        "simulated_s": round(result.end_s, 1),
        "wall_s": round(result.wall_s, 2),
        "cpu_s": round(result.cpu_s, 2),
        "simulated_per_wall_s": round(result.speedup, 1),
        "simulated_per_cpu_s": round(result.end_s / result.cpu_s, 1) if result.cpu_s else None,
    }


def run() -> dict[str, Any]:
    started = time.perf_counter()
    results: dict[str, Any] = {}
    for trace in TRACES:
        results[trace] = {}
        for profile in TOKEN_SCALE:
            comparison = compare(build(scenario(trace, profile)), list(POLICIES), Knobs())
            results[trace][profile] = figures(comparison)
            plot(
                comparison, f"{trace} trace, {profile} profile", RESULTS / f"autoscale-{trace}-{profile}.png"
            )
    results["criteria"] = criteria(results)
    results["tuning"] = tuning()
    results["kpa_targets"] = kpa_targets()
    results["startup_sweep"] = startup_sweep()
    results["speed"] = speed()
    results["reality"] = sim_reality.check()
    c, s, r = results["criteria"], results["speed"], results["reality"]
    results["summary"] = (
        f"conversation/gpu builtin: premium SLO {c['premium_slo_attainment']:.3f} "
        f"({c['premium_attainment_of_attainable']:.3f} of attainable) at "
        f"{c['replica_seconds_over_static_peak']:.2f}x static peak; 1 h x 8 replicas simulated "
        f"{s['simulated_per_wall_s']:.0f}x real time; sim vs real worker TTFT p50 "
        f"{r['ttft_p50_sim_over_real']}, hit ratio diff {r['hit_ratio_difference']}"
    )
    results["elapsed_s"] = round(time.perf_counter() - started, 1)
    return results
