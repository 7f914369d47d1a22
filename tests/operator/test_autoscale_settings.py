"""The autoscaler's settings: the interval and the testing-only scrape address."""

from __future__ import annotations

import pytest

from strata.operator.cli import build_settings, parser
from strata.operator.settings import OperatorSettings, SettingsError, settings_from, settings_from_env


def test_defaults_scrape_pod_ips_every_15_s() -> None:
    assert OperatorSettings().autoscale_interval_s == 15 and OperatorSettings().scrape_address == ""


def test_environment_and_flags() -> None:
    s = settings_from_env({"STRATA_AUTOSCALE_INTERVAL_S": "2", "STRATA_SCRAPE_ADDRESS": "127.0.0.1:8000"})
    assert s.autoscale_interval_s == 2 and s.scrape_address == "127.0.0.1:8000"
    flags = build_settings(parser().parse_args(["--autoscale-interval", "5", "--scrape-address", "h:1"]))
    assert flags.autoscale_interval_s == 5 and flags.scrape_address == "h:1"


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("autoscale_interval_s", "0", "STRATA_AUTOSCALE_INTERVAL_S: must be positive"),
        ("scrape_address", "localhost", "STRATA_SCRAPE_ADDRESS: 'localhost' is not host:port"),
        ("scrape_address", "h:99999", "not host:port"),
    ],
)
def test_bad_values_name_the_setting(key: str, value: str, fragment: str) -> None:
    with pytest.raises(SettingsError, match=fragment):
        settings_from({key: value})
