"""serving_experiments.roofline: points placed by the cost model under fake ceilings, the verdict from
the share of the roof reached, and the compute ceiling measured in the kernel the route runs."""

from __future__ import annotations

import pytest

from formulas import cost
from model_runner.loading import loader
from model_runner.loading.model_shape import shape_of
from serving_experiments import roofline as rl

PEAK, BANDWIDTH = 1e11, 1e10  # ridge at 10 FLOP/B


@pytest.fixture
def fake_ceilings(monkeypatch):
    seen = []

    def ceilings(device, dtype):
        seen.append((device, dtype))
        return PEAK, BANDWIDTH

    monkeypatch.setattr(rl, "ceilings", ceilings)
    return seen


@pytest.fixture(scope="module")
def int4():
    return loader.load("fake", "cpu", "int4")


def test_points_are_the_cost_models_flops_and_bytes_over_the_measured_time(int4, fake_ceilings):
    shape = shape_of(int4)
    result = rl.roofline(int4, {"tokens": 40, "ms": 2.0}, [{"batch": 4, "context": 41.5, "ms": 0.5}])
    prefill, decode = result["points"]
    assert fake_ceilings == [("cpu", "int4")]  # the peak asked for in the route the layers run
    assert prefill["intensity"] == pytest.approx(
        cost.prefill_flops(shape, 40) / cost.prefill_bytes(shape, 40), abs=1e-3
    )
    assert prefill["flops_s"] == pytest.approx(cost.prefill_flops(shape, 40) / 0.002, abs=0.1)
    flops = 4 * cost.decode_flops(shape, 41.5)
    assert decode["intensity"] == pytest.approx(flops / cost.decode_step_bytes(shape, 4, 41.5), abs=1e-3)
    assert decode["flops_s"] == pytest.approx(flops / 0.0005, abs=0.1)
    for p in result["points"]:
        assert p["attainable_flops_s"] == pytest.approx(min(PEAK, BANDWIDTH * p["intensity"]), rel=1e-3)
        assert p["share"] == pytest.approx(p["flops_s"] / p["attainable_flops_s"], rel=1e-3)
    assert result["ridge_intensity"] == 10 and result["route"] == "int4"
    assert {"peak_flops_s", "bandwidth_bytes_s", "basis", "points"} <= set(result)
    assert "int4 weight kernel" in result["basis"]


@pytest.mark.parametrize(
    "flops, read, seconds, expected",
    [
        (1e6, 1e6, 1e6 / (0.6 * 1e10), "memory-bound"),  # intensity 1, 60 % of the bandwidth roof
        (1e8, 1e6, 1e8 / (0.9 * PEAK), "compute-bound"),  # intensity 100, 90 % of the peak
        (1e6, 1e6, 1e6 / (0.2 * 1e10), rl.OVERHEAD),  # 20 % of the roof: neither roof holds it
        (1e8, 1e6, 1e8 / (0.3 * PEAK), rl.OVERHEAD),
    ],
)
def test_the_verdict_follows_the_share_of_the_roof_reached(flops, read, seconds, expected):
    p = rl.point(flops, read, seconds, PEAK, BANDWIDTH)
    assert p["verdict"] == expected


def test_the_threshold_sits_at_half_the_roof():
    assert rl.verdict(1.0, rl.HELD_BY_ROOF, 10) == "memory-bound"
    assert rl.verdict(1.0, rl.HELD_BY_ROOF - 0.001, 10) == rl.OVERHEAD


def test_the_compute_ceiling_is_the_routes_own_kernel(monkeypatch):
    calls = []
    monkeypatch.setattr(rl, "kernel_rate", lambda dev, route: calls.append(("kernel", route)) or {"gflop_per_s": 2.0})
    monkeypatch.setattr(
        rl, "matmul_rate", lambda dev, dtype: calls.append(("matmul", str(dtype))) or {"gflop_per_s": 3.0}
    )
    monkeypatch.setattr(rl, "copy_bandwidth", lambda dev: {"gb_per_s": 1.0})
    rl.ceilings.cache_clear()
    assert rl.ceilings("cpu", "int8") == (2e9, 1e9)
    assert rl.ceilings("cpu", "bfloat16") == (3e9, 1e9)
    rl.ceilings("cpu", "int8")  # measured once per process
    assert calls == [("kernel", "int8"), ("matmul", "torch.bfloat16")]
    rl.ceilings.cache_clear()


@pytest.mark.parametrize("route", ["int4", "int8"])
def test_the_route_kernels_measure(route):
    import torch

    got = rl.kernel_rate(torch.device("cpu"), route, n=64, repeats=2)
    assert got["flops"] == 2 * 64**3 and got["gflop_per_s"] > 0 and route in got["what"]
