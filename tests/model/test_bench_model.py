"""One small bench on the real model: both baselines run, greedy output is the same token for token
in the engine, the bare loop and generate() (the same shapes), with and without the KV cache up to a
near-tie (other shapes), and every ratio and estimate gets a value."""

from __future__ import annotations

import io
from datetime import datetime, timezone

from numerics import decided_margin, route_tolerance

from bench import runner as bench
from bench.clients import InProcessClient
from bench.grid import SCHEMA, Bench
from bench.grid_report import print_report
from bench.measure import Target
from bench.report import validate
from kvscope.cli import build_parser


def test_small_bench_on_the_real_model(real_engine):
    args = build_parser().parse_args(
        ["bench", "--prompt-lens", "40", "--output-lens", "8", "--concurrency", "1", "--repeats", "2", "--no-progress"]
    )
    target = Target(
        "in-process", InProcessClient(real_engine), real_engine.loaded, real_engine.describe_prompt, lambda: None
    )
    b = Bench(args, target, bench.grid_from(args))
    try:
        report = bench.measure_grid(b, datetime.now(timezone.utc), 0.0)
    finally:
        b.close()
    assert validate(report, SCHEMA) == []
    assert report["totals"]["completed"] == report["totals"]["requests"] == 2 + 2  # 2 repeats + cache probe
    for comparison in report["comparisons"]:
        assert comparison["generate_streamer"] is not None and comparison["bare_loop"] is not None
        assert comparison["greedy_identical"] is True
        assert all(value is not None and value > 0 for value in comparison["ratios"].values())
    probe = report["kv_cache_off"]  # without the cache every step is a whole-sequence forward: other sums
    if not probe["greedy_identical"]:  # so the answers may part only at a near-tie of the route's rounding
        near_tie = decided_margin(route_tolerance(real_engine.loaded.facts.dtype_route))
        assert probe["top_two_gap_there"] is not None and probe["top_two_gap_there"] <= near_tie, probe
    assert report["ceilings"]["copy_gb_per_s"] > 0 and report["ceilings"]["matmul_gflop_per_s"] > 0
    printed = io.StringIO()
    print_report(report, printed)
    assert "engine tokens/s / generate+streamer tokens/s" in printed.getvalue()
