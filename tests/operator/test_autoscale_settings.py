"""The autoscaler's setting: the interval between scrapes (pods are scraped at their pod IPs)."""

from __future__ import annotations

import pytest

from strata.operator.autoscale.pods import metrics_url
from strata.operator.cli import build_settings, parser
from strata.operator.settings import OperatorSettings, SettingsError, settings_from, settings_from_env


def test_defaults_scrape_every_15_s() -> None:
    assert OperatorSettings().autoscale_interval_s == 15


def test_environment_and_flags() -> None:
    assert settings_from_env({"STRATA_AUTOSCALE_INTERVAL_S": "2"}).autoscale_interval_s == 2
    assert OperatorSettings().utilization_window_s == 120
    assert settings_from_env({"STRATA_UTILIZATION_WINDOW_S": "30"}).utilization_window_s == 30
    flags = build_settings(parser().parse_args(["--autoscale-interval", "5"]))
    assert flags.autoscale_interval_s == 5


def test_a_pod_is_scraped_at_its_pod_ip() -> None:
    assert metrics_url("127.64.3.2", 8000) == "http://127.64.3.2:8000/metrics"
    assert metrics_url("fd00::2", 8000) == "http://[fd00::2]:8000/metrics"


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("autoscale_interval_s", "0", "STRATA_AUTOSCALE_INTERVAL_S: must be positive"),
        ("autoscale_interval_s", "soon", "STRATA_AUTOSCALE_INTERVAL_S: 'soon' is not a number"),
        ("utilization_window_s", "-5", "STRATA_UTILIZATION_WINDOW_S: must be positive"),
    ],
)
def test_bad_values_name_the_setting(key: str, value: str, fragment: str) -> None:
    with pytest.raises(SettingsError, match=fragment):
        settings_from({key: value})
