"""The router's decayed record of prefill tokens sent."""

from __future__ import annotations

import math

import pytest

from strata.router.load import DecayedTokens


def test_tokens_decay_with_the_time_constant_and_add_up():
    load = DecayedTokens(decay_s=30.0)
    assert load.value(0.0) == 0.0
    load.add(1000, now=10.0)
    assert load.value(10.0) == 1000
    assert load.value(40.0) == pytest.approx(1000 / math.e)
    load.add(500, now=40.0)
    assert load.value(40.0) == pytest.approx(1000 / math.e + 500)


def test_a_clock_reading_from_the_past_never_inflates_the_value():
    load = DecayedTokens()
    load.add(100, now=50.0)
    assert load.value(49.0) == 100
