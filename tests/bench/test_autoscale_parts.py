"""The autoscale benchmark's task runner: tasks in processes of their own, in dependency order,
parts kept and reused, and a budget that stops what is left with its name in ``not_run``."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from bench.autoscale_parts import part_path, run_all
from bench.autoscale_scenario import Task, fingerprint


def square(n: int, _: dict[str, Any]) -> dict[str, Any]:
    return {"value": n * n}


def plus_one(key: str, parts: dict[str, Any]) -> dict[str, Any]:
    return {"value": parts[key]["value"] + 1}


def broken(_: dict[str, Any]) -> dict[str, Any]:
    raise RuntimeError("this task fails")


def tasks() -> list[Task]:
    return [
        Task("b/plus", functools.partial(plus_one, "a/square"), after=("a/square",)),
        Task("a/square", functools.partial(square, 3)),
    ]


def test_tasks_run_after_what_they_need_and_their_parts_are_reused(tmp_path: Path) -> None:
    done, not_run = run_all(tasks(), budget_s=600, jobs=2, parts=tmp_path, log=lambda _: None)
    assert not_run == [] and done == {"a/square": {"value": 9}, "b/plus": {"value": 10}}
    stored = json.loads(part_path("b/plus", tmp_path).read_text())
    assert stored["fingerprint"] == fingerprint() and stored["figures"] == {"value": 10}
    said: list[str] = []
    again, _ = run_all(tasks(), budget_s=600, jobs=1, parts=tmp_path, log=said.append)
    assert again == done and len(said) == 1
    assert said[0].startswith(f"autoscale: 2 of 2 tasks reused from {tmp_path}")


def test_the_builtin_autoscalers_runs_depend_on_its_decision_and_the_peers_runs_do_not() -> None:
    assert fingerprint(builtin=True) != fingerprint(builtin=False)
    # a task's own files (the reality check's) count for it alone
    assert fingerprint(extra=("bench/sim_reality.py",)) != fingerprint()


def test_a_part_from_other_code_is_run_again(tmp_path: Path) -> None:
    run_all(tasks()[1:], budget_s=600, jobs=1, parts=tmp_path, log=lambda _: None)
    path = part_path("a/square", tmp_path)
    path.write_text(json.dumps({"key": "a/square", "fingerprint": "other", "figures": {"value": -1}}))
    done, _ = run_all(tasks()[1:], budget_s=600, jobs=1, parts=tmp_path, log=lambda _: None)
    assert done == {"a/square": {"value": 9}}


def test_a_spent_budget_or_a_failure_leaves_tasks_named_in_not_run(tmp_path: Path) -> None:
    done, not_run = run_all(tasks(), budget_s=0, jobs=1, parts=tmp_path, log=lambda _: None)
    assert done == {} and not_run == ["a/square", "b/plus"]
    said: list[str] = []
    failing = [Task("a/square", broken), tasks()[0]]
    done, not_run = run_all(failing, budget_s=600, jobs=1, parts=tmp_path, log=said.append)
    assert done == {} and not_run == ["a/square", "b/plus"]
    assert any(line.startswith("autoscale: a/square FAILED") for line in said)
