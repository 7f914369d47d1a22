"""``strata sim``: replay traces through a simulated fleet and compare scaling policies.

strata sim --trace mooncake_conversation.jsonl --tier premium --profile gpu --gpus 16
strata sim --scenario examples/sim/premium-batch.yaml --policies builtin,kpa --out /tmp/sim
strata sim --show-profile gpu > my-gpu.yaml       # a profile to edit, then --profile my-gpu.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from strata.operator.api.models import DEFAULT_TIER
from strata.sim.compare import compare, plot
from strata.sim.policies.catalog import POLICIES, Knobs
from strata.sim.profiles import resolve
from strata.sim.report import table
from strata.sim.scenario import ScenarioError, ScenarioFile, ServiceEntry, build, read
from strata.sim.trace import TraceError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="strata sim", description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", help="scenario YAML (services, tiers, traces, GPU budget)")
    p.add_argument("--trace", help="one service replaying this trace (instead of --scenario)")
    p.add_argument("--tier", default=DEFAULT_TIER, help=f"its ServiceTier (default: {DEFAULT_TIER})")
    p.add_argument("--profile", help="gpu, cpu or a profile YAML (default: the scenario's, else gpu)")
    p.add_argument("--gpus", type=int, default=32, help="GPU budget with --trace (default: 32)")
    p.add_argument("--max-replicas", type=int, default=16, help="service maxReplicas with --trace")
    p.add_argument("--duration-s", type=float, help="replay only this much of the trace")
    p.add_argument("--startup-s", type=float, help="pod start-up time (overrides the profile)")
    p.add_argument("--policies", default="builtin", help=f"comma-separated, of: {', '.join(POLICIES)}")
    p.add_argument("--router", choices=("strata", "random"), help="routing (default: the scenario's, strata)")
    p.add_argument("--kpa-target", type=float, default=4.0, help="KPA: requests in flight per replica")
    p.add_argument("--out", help="directory for summary.json and comparison.png")
    p.add_argument("--json", action="store_true", help="print the JSON summary instead of the table")
    p.add_argument("--show-profile", metavar="NAME", help="print a built-in profile as YAML and exit")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.show_profile:
        return _show(args.show_profile)
    try:
        spec, base = _scenario(args)
        scenario = build(spec, base)
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        unknown = [p for p in policies if p not in POLICIES]
        if unknown or not policies:
            raise ScenarioError(
                f"--policies: unknown {unknown or 'none given'}; expected of {', '.join(POLICIES)}"
            )
        knobs = Knobs(kpa_target=spec.kpa_target, kpa_default_target=args.kpa_target)
        result = compare(scenario, policies, knobs, log=lambda m: print(m, file=sys.stderr))
    except (ScenarioError, TraceError, ValueError) as err:
        print(f"strata sim: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_json(), indent=2) if args.json else table(result.summaries))
    if args.out:
        _write(args.out, result, scenario.profile.name)
    return 0


def _scenario(args: argparse.Namespace) -> tuple[ScenarioFile, Path | None]:
    if bool(args.scenario) == bool(args.trace):
        raise ScenarioError("give exactly one of --scenario and --trace")
    if args.scenario:
        spec, base = read(args.scenario), Path(args.scenario).parent
    else:
        entry = ServiceEntry(
            name="service",
            tier=args.tier,
            trace=args.trace,
            max_replicas=args.max_replicas,
            duration_s=args.duration_s,
        )
        spec, base = ScenarioFile(gpus=args.gpus, services=[entry]), None
    updates: dict[str, object] = {}
    if args.profile:
        updates["profile"] = args.profile
    if args.startup_s is not None:
        updates["startup_s"] = args.startup_s
    if args.router:
        updates["router"] = args.router
    return spec.model_copy(update=updates), base


def _write(out: str, result: object, profile: str) -> None:
    from strata.sim.compare import Comparison

    assert isinstance(result, Comparison)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(result.to_json(), indent=2) + "\n")
    try:
        path = plot(result, f"strata sim ({profile} profile)", folder / "comparison.png")
        print(f"wrote {folder / 'summary.json'} and {path}", file=sys.stderr)
    except RuntimeError as err:
        print(f"wrote {folder / 'summary.json'}; no plot: {err}", file=sys.stderr)


def _show(name: str) -> int:
    try:
        profile = resolve(name)
    except ValueError as err:
        print(f"strata sim: {err}", file=sys.stderr)
        return 2
    print(yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False), end="")
    return 0
