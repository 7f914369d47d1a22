"""The scaling act's live frame and closing table, from plain data."""

from __future__ import annotations

from strata.demo.tally import Tally
from strata.demo.view import LoadView, ServiceReport, ServiceView, frame, table
from strata.loadgen.summary import Summary
from strata.operator.autoscale.metrics import PodSample


def test_a_frame_shows_replicas_signals_load_and_the_latest_decisions() -> None:
    service = ServiceView(
        "chat",
        "premium",
        300,
        desired=3,
        ready=2,
        kv_usage=0.412,
        ttft_p95_ms=520,
        hit_ratio={"hbm": 0.31, "dram": 0.05},
        decisions=[f"12:00:0{i} reason {i}" for i in range(8)],
    )
    lines = frame(42.4, service, LoadView(answered=305, errors=0, ttft_p95_s=0.48))
    assert lines[0].startswith("[   42 s] chat (premium)  replicas 3 desired / 2 ready   KV 0.41")
    assert lines[0].endswith("TTFT p95 520 ms vs target 300 ms (over)")
    assert "hbm 0.31  dram 0.05  nvme -  shared -" in lines[1]
    assert "305 answered, 0 errors; clients' TTFT p95 480 ms" in lines[2]
    assert [line.split("scaled: ")[1] for line in lines[3:]] == [
        f"12:00:0{i} reason {i}" for i in range(2, 8)
    ]
    quiet = frame(0, ServiceView("bulk", "batch", 10_000), LoadView())
    assert "replicas - desired / - ready" in quiet[0] and quiet[-1].endswith("(no decision yet)")


def test_the_table_has_one_row_per_service_with_attainment_and_tier_hits() -> None:
    load = Summary(
        requests=400, errors=0, ttft_p50_s=0.1, ttft_p95_s=0.2512, slo_attainment=0.9712, cached_ratio=0.3
    )
    rows = table([ServiceReport("chat", "premium", 300, 3, load, {"hbm": 0.25, "dram": 0.051})])
    assert rows[0].split() == [
        "service", "tier", "peak", "replicas", "requests", "errors", "TTFT", "p95", "target", "SLO", "met",
        "hbm", "dram", "nvme", "shared",
    ]  # fmt: skip
    assert rows[1].split() == [
        "chat", "premium", "3", "400", "0", "251", "ms", "300ms", "97%", "0.25", "0.05", "-", "-",
    ]  # fmt: skip


def test_the_tally_keeps_the_peak_and_every_pods_last_counters() -> None:
    tally = Tally()
    for desired in (1, None, 3, 2, 1):
        tally.replicas(desired)
    tally.scraped("a", PodSample(prompt_tokens=100, prefix_hit_tokens={"hbm": 40}, ttft_count=5))
    tally.scraped("a", PodSample(prompt_tokens=200, prefix_hit_tokens={"hbm": 60}, ttft_count=9))
    tally.scraped("b", PodSample(prompt_tokens=200, prefix_hit_tokens={"hbm": 20, "dram": 40}, ttft_count=4))
    assert tally.peak_replicas == 3
    assert tally.hit_ratio() == {"hbm": 0.2, "dram": 0.1}  # a's latest counters, and b's (gone since)
    assert tally.served() == {"a": 9, "b": 4}
    assert Tally().hit_ratio() == {}
