"""The reality check's pure parts: the engine's share of a core, read from /proc, and the
calibrated profile stretched by the slowdown between calibration and replay."""

from __future__ import annotations

import os
import threading
import time

import pytest

from bench.sim_reality import Meter, profile_from, thread_cpu_s
from strata.sim.calibrate import StepCosts

COSTS = StepCosts(
    overhead_s=0.005,
    decode_seq_s=0.001,
    decode_context_token_s=1e-6,
    prefill_token_s=2e-4,
    attention_pair_s=1e-8,
)


def test_thread_cpu_is_counted_per_thread():
    spun, release = threading.Event(), threading.Event()
    ident: list[int] = []

    def spin() -> None:
        ident.append(threading.get_native_id())
        until = time.thread_time() + 0.3  # CPU time, however busy the machine is
        while time.thread_time() < until:
            pass
        spun.set()
        release.wait(timeout=600)  # alive until it has been read

    before = thread_cpu_s(os.getpid())
    thread = threading.Thread(target=spin)
    thread.start()
    assert spun.wait(timeout=600), "the spinning thread never finished"
    after = thread_cpu_s(os.getpid())
    release.set()
    thread.join()
    mine = str(ident[0])
    assert mine not in before and after[mine] >= 0.25  # clock ticks: 0.3 s within a tick or two


def test_the_share_of_a_core_and_the_slowdown_stretch_every_step_cost():
    assert Meter(busy_s=10.0, cpu_s=5.0).share == 0.5
    assert Meter(busy_s=0.0, cpu_s=0.0).share == 1.0  # nothing to measure: no correction
    plain, slow = profile_from(COSTS), profile_from(COSTS, 2.0)
    for name in (
        "overhead_s",
        "prefill_token_s",
        "attention_pair_s",
        "decode_seq_s",
        "decode_context_token_s",
    ):
        assert getattr(slow, name) == pytest.approx(2 * getattr(plain, name)), name
    assert slow.lone_prefill_s(512) == pytest.approx(2 * plain.lone_prefill_s(512))
