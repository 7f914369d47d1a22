"""The chaos benchmark's arithmetic, without a cluster: one response classified from what its
client saw, and a fault's row added up from its responses."""

from __future__ import annotations

import dataclasses

from bench.chaos_outcome import Kind, Response, classify, hit_ratio_back_at, recovery_s, row, table

DONE = Response(sent_s=0.0, done_s=1.0, prompt=0, status=200, tokens=8, finished=True, text="abc")


def test_a_stream_that_reached_its_end_is_answered() -> None:
    assert classify(DONE) is Kind.ANSWERED


def test_a_stream_that_broke_after_its_first_token_is_cut_whatever_the_error() -> None:
    broken = dataclasses.replace(DONE, finished=False, tokens=3, error="RemoteProtocolError: peer closed")
    assert classify(broken) is Kind.CUT


def test_429_or_503_with_retry_after_is_refused_without_it_lost() -> None:
    for status in (429, 503):
        refused = Response(0.0, 1.0, 0, status=status, retry_after=True)
        assert classify(refused) is Kind.REFUSED
        assert classify(dataclasses.replace(refused, retry_after=False)) is Kind.LOST


def test_a_closed_connection_or_a_5xx_before_any_token_is_lost() -> None:
    assert classify(Response(0.0, 1.0, 0, error="ReadError: closed")) is Kind.LOST
    assert classify(Response(0.0, 1.0, 0, status=502)) is Kind.LOST
    assert classify(Response(0.0, 1.0, 0, status=500, retry_after=True)) is Kind.LOST
    # A 200 whose stream ended without its final event and without a token: nothing came.
    assert classify(dataclasses.replace(DONE, finished=False, tokens=0)) is Kind.LOST


def answered(done_s: float, cached: int, prompt: int = 0, text: str = "abc") -> Response:
    return dataclasses.replace(
        DONE, done_s=done_s, prompt=prompt, prompt_tokens=100, cached_tokens=cached, text=text
    )


def test_a_row_counts_each_kind_and_the_answers_that_differ_from_the_reference() -> None:
    responses = [
        answered(1.0, 50),
        answered(2.0, 50, prompt=1, text="xyz"),  # the reference says "def"
        Response(0.0, 2.0, 0, status=429, retry_after=True),
        Response(0.0, 2.0, 0, error="ReadError: closed"),
        dataclasses.replace(DONE, finished=False, tokens=2),
    ]
    got = row("engine", responses, {0: "abc", 1: "def"}, 0, 12.5)
    assert (got.sent, got.answered, got.refused, got.lost, got.cut) == (5, 2, 1, 1, 1)
    assert got.wrong_output == 1 and got.hit_ratio == 0.5 and got.recovery_s == 12.5
    assert got.errors == ("ReadError: closed", "stream ended early")
    assert got.as_json()["errors"] == ["ReadError: closed", "stream ended early"]


def test_the_hit_ratio_is_back_when_a_window_of_answers_after_ready_reaches_the_target() -> None:
    cold = [answered(10.0 + i, 0) for i in range(10)]
    warm = [answered(30.0 + i, 80) for i in range(10)]
    # Each answer moves the window by one: the window is all warm at the tenth warm answer.
    assert hit_ratio_back_at([*cold, *warm], since_s=20.0, target=0.8, window=10) == 39.0
    assert hit_ratio_back_at([*cold, *warm], since_s=20.0, target=0.4, window=10) == 34.0
    assert hit_ratio_back_at(cold, since_s=0.0, target=0.1, window=10) is None


def test_recovery_is_the_later_of_ready_and_back_to_the_hit_ratio_from_the_fault() -> None:
    warm = [answered(30.0 + i, 80) for i in range(10)]
    assert recovery_s(warm, fault_s=5.0, ready_s=20.0, steady_hit=0.8) == 34.0
    assert recovery_s(warm, fault_s=5.0, ready_s=50.0, steady_hit=0.8) is None  # no answers after
    assert recovery_s(warm, fault_s=5.0, ready_s=None, steady_hit=0.8) is None
    assert recovery_s([], fault_s=5.0, ready_s=20.0, steady_hit=None) == 15.0


def test_the_table_has_a_line_a_fault_and_the_totals() -> None:
    rows = [row("engine", [answered(1.0, 50)], {0: "abc"}, 0, 3.0), row("etcd", [], {}, 0, None)]
    lines = table(rows)
    assert len(lines) == 4 and lines[0].split()[0] == "fault"
    assert lines[1].split() == ["engine", "1", "1", "0", "0", "0", "0", "0", "3.0"]
    assert lines[2].endswith("not back")
    assert lines[3].split()[:3] == ["total", "1", "1"]
