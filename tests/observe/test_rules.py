"""The generated rules file: promtool checks it and runs its unit tests, which cover every rule."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from strata.observe import rules
from strata.observe.prometheus import find_binary

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / rules.RULES_FILE
TESTS = Path(__file__).with_name("rules_test.yaml")

pytestmark = pytest.mark.cluster  # needs promtool from `make prometheus` (test-fast installs nothing)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(find_binary("promtool")), *args], capture_output=True, text=True, cwd=TESTS.parent
    )


def test_promtool_checks_the_rules() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules.names())} rules found" in done.stdout


def test_promtool_unit_tests_pass() -> None:
    done = promtool("test", "rules", TESTS.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_a_broken_expectation_fails_the_unit_tests(tmp_path: Path) -> None:
    """The unit tests can fail: a wrong expected value is reported."""
    text = TESTS.read_text().replace("value: 0.46875", "value: 0.5", 1)
    broken = TESTS.with_name("broken_rules_test.yaml")
    broken.write_text(text)
    try:
        done = promtool("test", "rules", broken.name)
    finally:
        broken.unlink()
    assert done.returncode != 0 and "strata:ttft_seconds:p95_rate5m" in done.stdout + done.stderr


def test_every_recording_rule_and_alert_has_a_unit_test() -> None:
    cases = yaml.safe_load(TESTS.read_text())["tests"]
    exprs = " ".join(t["expr"] for case in cases for t in case.get("promql_expr_test", []))
    alerts = {t["alertname"] for case in cases for t in case.get("alert_rule_test", []) if t["exp_alerts"]}
    for name in rules.names():
        assert name in exprs or name in alerts, f"{name} has no promtool unit test in {TESTS.name}"


def test_the_committed_file_is_what_the_rules_module_generates() -> None:
    assert RULES.read_text() == rules.rules_file()
