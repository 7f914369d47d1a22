"""GPU placement with priority preemption."""

from __future__ import annotations

from strata.sim.placement import Holds, Want, place


def test_pending_pods_start_in_priority_then_age_order_while_gpus_last():
    decision = place([Want("low", 1, 1, 0.0), Want("high-late", 9, 1, 5.0), Want("high", 9, 1, 1.0)], [], 2)
    assert decision.start == ("high", "high-late") and decision.evict == ()


def test_a_higher_priority_pod_evicts_the_lowest_newest_running_pods():
    running = [Holds("b-old", 1, 1, 0.0), Holds("b-new", 1, 1, 10.0), Holds("s", 5, 1, 0.0)]
    decision = place([Want("p", 9, 1, 20.0)], running, 3)
    assert decision.evict == ("b-new",) and decision.start == ("p",)


def test_nothing_is_evicted_unless_it_makes_the_pod_fit():
    running = [Holds("b", 1, 1, 0.0), Holds("p", 9, 2, 0.0)]
    decision = place([Want("p2", 9, 4, 1.0)], running, 4)
    assert decision == place([], running, 4)  # 1 GPU from the batch pod would not be enough


def test_equal_priority_never_preempts():
    decision = place([Want("x", 5, 1, 1.0)], [Holds("y", 5, 1, 0.0)], 1)
    assert decision.start == () and decision.evict == ()
