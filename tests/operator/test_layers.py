"""Layering of the operator: api -> resolve/render -> children -> handlers, imports downward only.

Checked on whole import chains in a fresh interpreter, not on each file's own import lines: the
decisions (validate, resolve, render, pick a replica count, what a watch event asks for, what of
a body is kept) load no Kubernetes client, no kopf, no HTTP stack and none of the modules that
write to the API server, so they stay pure and testable without a cluster."""

from __future__ import annotations

import json
import subprocess
import sys

DECISIONS = (
    "api.models",
    "api.policy",
    "resolve",
    "plan",
    "render.workload",
    "render.router",
    "render.configmap",
    "render.priorityclass",
    "status",
    "ready",
    "replicas",
    "child_events",
    "slim",
    "views",
    "autoscale.decide",
    "autoscale.cachevalue",
    "autoscale.bottleneck",
    "autoscale.cost",
    "autoscale.backoff",
    "autoscale.modelsize",
)
# Third-party packages that do I/O (or, for torch, belong to the worker).
EFFECTFUL = {"kopf", "kubernetes", "aiohttp", "httpx", "torch"}
# The operator's own modules that talk to the API server or wire kopf.
GLUE = {"handlers", "runtime", "children", "kube", "reconcile", "runner", "slimwatch", "autoscale.loop"}
WRITERS = {"handlers", "runtime", "reconcile", "slimwatch", "autoscale.loop"}  # above the Applier


def _loaded_by(module: str) -> tuple[set[str], set[str]]:
    code = f"import json, sys\nimport strata.operator.{module}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    loaded = json.loads(out)
    third_party = {m.split(".")[0] for m in loaded}
    ours = {m.removeprefix("strata.operator.") for m in loaded if m.startswith("strata.operator.")}
    return third_party, ours


def test_decisions_load_no_client_no_kopf_and_no_glue() -> None:
    problems = {}
    for module in DECISIONS:
        third_party, ours = _loaded_by(module)
        bad = sorted((third_party & EFFECTFUL) | (ours & GLUE))
        if bad:
            problems[module] = bad
    assert not problems, f"decision modules reach up or out: {problems}"


def test_the_applier_does_not_reach_up_into_the_wiring() -> None:
    third_party, ours = _loaded_by("children")
    assert not ours & WRITERS, sorted(ours & WRITERS)
    assert "kopf" not in third_party
