"""Scenario files: which services (tier, trace, bounds) share how many GPUs on which profile,
and the ServiceTiers they use (the chart's default tiers unless a directory is given).

```yaml
profile: gpu            # a built-in profile (gpu, cpu) or a profile YAML file
gpus: 16                # the shared budget
startup_s: 60           # optional: overrides the profile's pod start-up time
services:
  - name: chat
    tier: premium
    trace: mooncake_conversation.jsonl   # relative to this file, else to the traces directory
    max_replicas: 16
  - name: jobs
    tier: batch
    trace: mooncake_synthetic.jsonl
    offset_s: 1200                       # starts 20 minutes in
    min_replicas: 0
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from strata.common.traces import traces_dir
from strata.operator.api import ServiceTier
from strata.operator.api.generate import CHART_TIERS
from strata.sim import trace as traces
from strata.sim.profiles import resolve
from strata.sim.run import Scenario
from strata.sim.service import ServiceConfig

REPO = Path(__file__).resolve().parents[2]


class ScenarioError(ValueError):
    """A scenario that cannot be simulated; the message names the field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServiceEntry(_Strict):
    name: str = Field(min_length=1, max_length=52)
    tier: str = Field(min_length=1)
    trace: str = Field(min_length=1, description="Trace file (mooncake JSON lines or an arrivals CSV).")
    format: Literal["auto", "mooncake", "arrivals"] = "auto"
    block_tokens: int = Field(traces.MOONCAKE_BLOCK_TOKENS, ge=1)
    start_s: float = Field(0.0, ge=0, description="Replay the trace from this point of it.")
    duration_s: float | None = Field(None, gt=0, description="Replay only this much of it.")
    time_scale: float = Field(1.0, gt=0, description="Multiply arrival times (below 1: faster).")
    token_scale: int = Field(
        1, ge=1, description="Divide every token count (and the block size) by this: a slower engine's trace."
    )
    spread_s: float = Field(
        0.0, ge=0, description="Spread requests sharing a timestamp over this many seconds after it."
    )
    offset_s: float = Field(0.0, ge=0, description="Start the replay this long into the run.")
    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(16, ge=1)
    replicas: int = Field(1, ge=0, description="Replicas at the start.")
    gpus_per_replica: int = Field(1, ge=1)
    shared_cache: bool = True


class ScenarioFile(_Strict):
    profile: str = "gpu"
    gpus: int = Field(ge=1)
    startup_s: float | None = Field(None, ge=0)
    seed: int = 0
    router: Literal["strata", "random"] = Field("strata", description="strata: the router's choice function.")
    tiers: str | None = Field(None, description="Directory of ServiceTier YAML; default: the chart's.")
    services: list[ServiceEntry] = Field(min_length=1)
    kpa_target: dict[str, float] = Field(default_factory=dict, description="Per service: KPA target.")


def load_tiers(directory: str | Path | None = None) -> dict[str, ServiceTier]:
    folder = Path(directory) if directory is not None else REPO / CHART_TIERS
    tiers: dict[str, ServiceTier] = {}
    for path in sorted(folder.glob("*.yaml")):
        try:
            tier = ServiceTier.model_validate(yaml.safe_load(path.read_text()))
        except (ValidationError, yaml.YAMLError) as err:
            raise ScenarioError(f"{path}: not a valid ServiceTier: {_first(err)}") from err
        tiers[str(tier.metadata.get("name", path.stem))] = tier
    if not tiers:
        raise ScenarioError(f"tiers: no ServiceTier YAML files in {folder}")
    return tiers


def read(path: str | Path) -> ScenarioFile:
    source = Path(path)
    try:
        return ScenarioFile.model_validate(yaml.safe_load(source.read_text()))
    except OSError as err:
        raise ScenarioError(f"{source}: cannot read: {err.strerror or err}") from err
    except (ValidationError, yaml.YAMLError) as err:
        raise ScenarioError(f"{source}: {_first(err)}") from err


def build(spec: ScenarioFile, base: Path | None = None) -> Scenario:
    """The scenario to simulate: traces read, tiers loaded, profile resolved."""
    profile = resolve(spec.profile if base is None else _near(spec.profile, base))
    if spec.startup_s is not None:
        profile = profile.model_copy(update={"startup_s": spec.startup_s})
    tiers = load_tiers(_near(spec.tiers, base) if spec.tiers else None)
    names = [s.name for s in spec.services]
    if len(set(names)) != len(names):
        raise ScenarioError(f"services: names must be unique, got {names}")
    services = tuple(_service(entry, base, spec.seed) for entry in spec.services)
    return Scenario(services, tiers, profile, spec.gpus, spec.seed, spec.router)


def _service(entry: ServiceEntry, base: Path | None, seed: int) -> ServiceConfig:
    path = _trace_path(entry.trace, base)
    try:
        loaded = traces.load(path, entry.format, entry.block_tokens)
    except traces.TraceError as err:
        raise ScenarioError(f"services.{entry.name}.trace: {err}") from err
    try:
        window = loaded.window(entry.start_s, entry.duration_s).scaled(entry.token_scale)
    except traces.TraceError as err:
        raise ScenarioError(f"services.{entry.name}.{err}") from err
    window = window.spread(entry.spread_s, seed)
    replay = window.retimed(entry.time_scale, entry.offset_s)
    if not replay.requests:
        raise ScenarioError(f"services.{entry.name}: no requests in the chosen window of {path}")
    return ServiceConfig(
        entry.name,
        entry.tier,
        replay,
        entry.min_replicas,
        entry.max_replicas,
        entry.replicas,
        entry.gpus_per_replica,
        entry.shared_cache,
    )


def _trace_path(name: str, base: Path | None) -> Path:
    for candidate in (Path(name), *(b / name for b in (base, traces_dir()) if b is not None)):
        if candidate.exists():
            return candidate
    raise ScenarioError(f"trace: {name!r} not found (also looked in {base or '.'} and {traces_dir()})")


def _near(name: str, base: Path | None) -> str:
    if base is not None and (base / name).exists():
        return str(base / name)
    return name


def _first(err: Exception) -> str:
    if isinstance(err, ValidationError):
        first = err.errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
    return str(err)
