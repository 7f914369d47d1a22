"""Benchmarks: `make bench` (or `python -m bench [names...]`).

Each ``bench/bench_<name>.py`` has ``run() -> dict``; its result is written to
``bench/results/<name>.json`` and summarised in one line. Speed is only ever measured here,
never asserted in tests; figures are reported as ratios measured side by side in one run.
"""
