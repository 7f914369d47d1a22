"""What the operator makes of the KV size the workers report: the figure most pods give, the
Event that tells the owner what to set, and status.model written only when the figure moves."""

from __future__ import annotations

from strata.operator.autoscale.metrics import PodSample
from strata.operator.autoscale.modelsize import advice, model_status, reported


def pods(*figures: int | None) -> list[PodSample]:
    return [PodSample(kv_usage=0.1, kv_bytes_per_token=f) for f in figures]


def test_the_figure_most_pods_report_and_the_larger_on_a_tie():
    assert reported(pods(131072, 131072, 12288)) == 131072
    assert reported(pods(12288, 131072)) == 131072  # rolling between models: the larger is safe
    assert reported(pods(None, 12288)) == 12288
    assert reported(pods(None, None)) is None and reported([]) is None


def test_the_owner_is_told_what_to_set_when_the_spec_is_silent_or_wrong():
    unset = advice(None, 131072)
    assert unset is not None and (unset.type, unset.reason) == ("Normal", "KVBytesPerTokenUnset")
    assert "set spec.model.kvBytesPerToken: 131072" in unset.message
    wrong = advice(57344, 131072)
    assert wrong is not None and (wrong.type, wrong.reason) == ("Warning", "KVBytesPerTokenDiffers")
    assert "is 57344" in wrong.message and "kvBytesPerToken: 131072" in wrong.message
    assert advice(131072, 131072) is None


def test_status_is_written_only_for_a_new_figure():
    first = model_status(None, 12288, "2026-12-03T08:00:00Z")
    assert first == {"kvBytesPerToken": 12288, "observedAt": "2026-12-03T08:00:00Z"}
    assert model_status(first, 12288, "2026-12-03T09:00:00Z") is None
    assert model_status(first, 131072, "2026-12-03T09:00:00Z") == {
        "kvBytesPerToken": 131072,
        "observedAt": "2026-12-03T09:00:00Z",
    }
