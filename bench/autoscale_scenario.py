"""What the ``autoscale`` benchmark simulates: a premium chat service and a batch job sharing a
GPU budget, on both shared traces and both profiles, and the variants of its sweeps. Each run of
the benchmark is one *task* (``Task``): a static sizing, or one policy on one scenario.

``fingerprint`` hashes everything a task's figures depend on (this file, the simulator, the
autoscaler's decision, the router's choice, the tier caches' policies, the default tiers and the
traces): a task's stored part is reused only while it is unchanged (bench/autoscale_parts.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from strata.common.traces import traces_dir
from strata.operator.api.generate import CHART_TIERS
from strata.sim.scenario import REPO, ScenarioFile, ServiceEntry

TRACES = {"conversation": "mooncake_conversation.jsonl", "synthetic": "mooncake_synthetic.jsonl"}
SPANS_S = {"conversation": 3537.0, "synthetic": 1022.0}
# The CPU profile's `small` model prefills ~13x slower per token than an H100 runs an 8B model:
# its runs replay the same requests with every token count divided by 16 (blocks of 32 tokens).
TOKEN_SCALE = {"gpu": 1, "cpu": 16}
GPUS = 24
STARTUPS_S = (30.0, 120.0, 300.0)  # besides the profile's 60 s, which the matrix runs
SPEED_REPLICAS = 8
KPA_TARGETS = (2.0, 8.0)  # besides the default 4, which the matrix runs
# Premium settings tried against the shipped ones (targetPrefillUtilization 0.2, windows 30 s up /
# 180 s down, step 4): each changes one thing, or two.
PREMIUM_VARIANTS: dict[str, dict[str, Any]] = {
    "target 0.15": {"targetPrefillUtilization": 0.15},
    "target 0.25": {"targetPrefillUtilization": 0.25},
    "target 0.3": {"targetPrefillUtilization": 0.3},
    # Cheaper still: where the built-in autoscaler meets kv_threshold's and the planner's cost.
    "target 0.4": {"targetPrefillUtilization": 0.4},
    "target 0.6": {"targetPrefillUtilization": 0.6},
    # Laxer still (1.0 is the most a utilization can be): where a queue's TTFT and the KV usage
    # (0.7) take over from the prefill load.
    "target 0.8": {"targetPrefillUtilization": 0.8},
    "target 1.0": {"targetPrefillUtilization": 1.0},
    "windows 0/600 s": {"scaleUpStabilizationSeconds": 0, "scaleDownStabilizationSeconds": 600},
    "scale-down window 300 s": {"scaleDownStabilizationSeconds": 300},
    "scale-down window 120 s": {"scaleDownStabilizationSeconds": 120},
    "scale-up window 0 s": {"scaleUpStabilizationSeconds": 0},
    "step 8": {"maxScaleUpStep": 8},
}
HASHED = (
    "bench/autoscale_scenario.py",
    "strata/sim",
    "router/choose.py",
    "router/weights.py",
    "router/load.py",
    "router/config.py",
    "worker/kvtier/index.py",  # the tiers' index, eviction and admission; not the sidecar's I/O
    "worker/kvtier/policy.py",
    "worker/kvtier/admission.py",
    "worker/engine/block_manager.py",
    "charts/strata/files/servicetiers",
)
# What only the built-in autoscaler's runs depend on besides: a change to the decision reruns
# those, not the peers'.
BUILTIN_HASHED = (
    "operator/autoscale/decide.py",
    "operator/autoscale/wake.py",
    "operator/autoscale/signals.py",
    "strata/sim/policies/builtin.py",
)


def scenario(
    trace: str, profile: str, startup_s: float | None = None, tiers: str | None = None
) -> ScenarioFile:
    """Premium chat replays the whole trace; a batch job of ten minutes of the same trace,
    submitted in five, arrives a third of the way in (and needs its replicas woken from zero)."""
    spread = 3.0 if trace == "conversation" else 0.0  # that trace records arrivals in 3 s slots
    common = {
        "trace": TRACES[trace],
        "token_scale": TOKEN_SCALE[profile],
        "spread_s": spread,
        "max_replicas": 16,
    }
    chat = ServiceEntry(name="chat", tier="premium", replicas=4, **common)
    jobs = ServiceEntry(
        name="jobs",
        tier="batch",
        duration_s=600.0,
        time_scale=0.5,
        offset_s=round(SPANS_S[trace] / 3),
        min_replicas=0,
        replicas=0,
        **common,
    )
    return ScenarioFile(profile=profile, gpus=GPUS, startup_s=startup_s, tiers=tiers, services=[chat, jobs])


def speed_scenario() -> ScenarioFile:
    """The one-hour conversation trace through 8 static replicas of the GPU profile."""
    chat = ServiceEntry(
        name="chat",
        tier="premium",
        trace=TRACES["conversation"],
        spread_s=3.0,
        replicas=SPEED_REPLICAS,
        max_replicas=SPEED_REPLICAS,
    )
    return ScenarioFile(profile="gpu", gpus=SPEED_REPLICAS, services=[chat])


def tiers_with(folder: Path, premium: dict[str, Any]) -> str:
    """The chart's default tiers in ``folder``, premium's autoscaling changed by ``premium``."""
    for path in (REPO / CHART_TIERS).glob("*.yaml"):
        tier = yaml.safe_load(path.read_text())
        if tier["metadata"]["name"] == "premium":
            tier["spec"]["autoscaling"].update(premium)
        (folder / path.name).write_text(yaml.safe_dump(tier))
    return str(folder)


@dataclass(frozen=True)
class Task:
    """One run: ``key`` names its part; ``after`` are the keys whose parts it reads."""

    key: str
    run: Callable[[dict[str, Any]], dict[str, Any]]  # the parts it depends on -> its figures
    after: tuple[str, ...] = field(default=())
    builtin: bool = False  # runs the built-in autoscaler
    hashed: tuple[str, ...] = field(default=())  # files only this task's figures depend on besides

    @property
    def code(self) -> tuple[bool, tuple[str, ...]]:
        """What its fingerprint covers (``fingerprint``'s arguments)."""
        return self.builtin, self.hashed


def fingerprint(builtin: bool = False, extra: tuple[str, ...] = (), root: Path = REPO) -> str:
    """The code and data a task's figures depend on (with ``builtin``: the built-in
    autoscaler's too; ``extra``: files of that task alone)."""
    digest = hashlib.sha256()
    skip = () if builtin else BUILTIN_HASHED
    for name in HASHED + (BUILTIN_HASHED if builtin else ()) + extra:
        path = root / name
        for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
            relative = str(file.relative_to(root))
            if file.is_file() and "__pycache__" not in file.parts and relative not in skip:
                digest.update(relative.encode() + b"\0" + file.read_bytes())
    for trace in TRACES.values():
        path = traces_dir() / trace
        digest.update(f"{trace}:{path.stat().st_size if path.exists() else 'missing'}".encode())
    return digest.hexdigest()[:16]
