"""serving_experiments.roofline: each step judged against the kernels that ran it (float32 GEMM for a prompt
of FLOAT_ROWS rows or more where the route keeps float32 copies, else the route's own kernel; the int4 kernel and the head's int8 pass at a decode batch's rows), the verdict
from the larger of its two floors (its kernels alone, its bytes at the copy bandwidth), and the kernels
timed as the model calls them."""

from __future__ import annotations

import pytest

from formulas import cost
from model_runner.loading import loader
from model_runner.loading.model_shape import shape_of
from serving_experiments import kernels as kernels_mod
from serving_experiments import roofline as rl

BANDWIDTH = 1e10


@pytest.fixture(scope="module")
def int4():
    return loader.load("fake", "cpu", "int4")


@pytest.fixture
def fake_kernels(monkeypatch):
    """Kernel times of 1 ms a layer pass and 0.1 ms a head call at any rows; the copy at BANDWIDTH."""
    seen = []

    def measure(self, calls):
        seen.extend(calls)
        return {c: (1e-3 if c[0] == "layers" else 1e-4) for c in calls}

    monkeypatch.setattr(kernels_mod.Kernels, "measure", measure)
    monkeypatch.setattr(rl, "ceilings", lambda device, dtype: (1e11, BANDWIDTH))
    return seen


def test_each_step_is_judged_against_the_kernels_that_ran_it(int4, fake_kernels):
    shape = shape_of(int4)
    result = rl.roofline(int4, {"tokens": 40, "ms": 2.0}, [{"batch": 4, "context": 41.5, "ms": 4.0}])
    prefill, decode = result["points"]
    # the prompt's 40 rows on the float32 copies and its one row of logits; the decode batch's 4 rows on int4
    assert ("layers", 40, False) in fake_kernels and ("head", 1, False) in fake_kernels
    assert ("layers", 4, True) in fake_kernels and ("head", 4, True) in fake_kernels
    assert prefill["kernel"] == "float32 GEMM" and decode["kernel"] == "int4 kernel"
    assert prefill["kernel_ms"] == pytest.approx(1.1) and decode["kernel_ms"] == pytest.approx(1.1)
    flops = 4 * cost.decode_flops(shape, 41.5)
    read = cost.decode_step_bytes(shape, 4, 41.5)
    assert decode["intensity"] == pytest.approx(flops / read, abs=1e-3)
    assert decode["flops_s"] == pytest.approx(flops / 0.004, abs=0.1)
    assert decode["memory_ms"] == pytest.approx(read / BANDWIDTH * 1000, abs=1e-3)
    for p in result["points"]:
        floor = max(p["kernel_ms"], p["memory_ms"])
        assert p["share"] == pytest.approx(floor / p["step_ms"], rel=1e-3)
        assert p["attainable_flops_s"] == pytest.approx(p["flops_s"] / p["share"], rel=1e-3)
    assert result["bandwidth_bytes_s"] == BANDWIDTH and result["route"] == "int4"
    assert {"peak_flops_s", "gemm_flops_s", "ridge_intensity", "basis", "points"} <= set(result)


def test_a_short_prompt_runs_on_the_int4_kernel_like_a_decode():
    assert rl.kernel_name("int4", cost.FLOAT_ROWS - 1, False, float_prefill=True) == "int4 kernel"
    assert rl.kernel_name("int4", cost.FLOAT_ROWS, False, float_prefill=True) == "float32 GEMM"
    assert rl.kernel_name("int4", 64, True, float_prefill=True) == "int4 kernel"
    assert rl.kernel_name("float32", 1, True, float_prefill=False) == "float32 GEMM"


@pytest.mark.parametrize("route", ["int8", "int4"])
def test_a_route_without_float_copies_runs_a_long_prompt_on_its_own_kernel(route):
    # Int8Linear has no float path, and Int4Linear runs one only with keep_float (the route's float_prefill)
    assert rl.kernel_name(route, 1024, False, float_prefill=False) == f"{route} kernel"
    text = rl.kernels_text(route, 64, False, float_prefill=False)
    assert text == f"the {route} kernel at 64 rows and the head's int8 pass at 1 row"
    assert "float32" not in rl.route_rule(route, float_prefill=False).split("(")[0]


def _no_float_copies(loaded):
    """The loaded model's cost shape as if its route kept no float32 copies for prompts (int4 under a CPU
    capability where float_prefill_for is false)."""
    import dataclasses

    return dataclasses.replace(shape_of(loaded), float_prefill=False)


def test_the_int8_route_names_its_own_kernel_for_every_step(fake_kernels):
    int8 = loader.load("fake", "cpu", "int8")
    assert not shape_of(int8).float_prefill
    result = rl.roofline(int8, {"tokens": 40, "ms": 2.0}, [{"batch": 4, "context": 41.5, "ms": 4.0}])
    assert [p["kernel"] for p in result["points"]] == ["int8 kernel", "int8 kernel"]
    assert result["peak_kernel"].startswith("int8 kernel on this model's layers")
    assert "float32" not in result["peak_kernel"] + " ".join(p["kernels"] for p in result["points"])
    assert rl.route_rule("int8", False) in result["basis"]


def test_int4_without_float_copies_names_the_int4_kernel_for_a_prompt(int4, fake_kernels, monkeypatch):
    monkeypatch.setattr(rl, "shape_of", _no_float_copies)
    result = rl.roofline(int4, {"tokens": 40, "ms": 2.0}, [{"batch": 4, "context": 41.5, "ms": 4.0}])
    assert result["points"][0]["kernel"] == "int4 kernel"
    assert result["peak_kernel"].startswith("int4 kernel")


@pytest.mark.parametrize("route", ["int4", "int8", "float32"])
def test_the_basis_fills_in_every_placeholder(route, fake_kernels):
    loaded = loader.load("fake", "cpu", route)
    shape = shape_of(loaded)
    result = rl.roofline(loaded, {"tokens": 40, "ms": 2.0}, [{"batch": 4, "context": 41.5, "ms": 4.0}])
    assert "{" not in result["basis"] and "}" not in result["basis"]
    assert rl.route_rule(shape.route, shape.float_prefill) in result["basis"]


def test_the_recorded_basis_is_what_the_code_writes_for_its_route():
    import json
    from pathlib import Path

    trace = Path(__file__).resolve().parents[2] / "static/data/serving-trace.json"
    roof = json.loads(trace.read_text(encoding="utf-8"))["experiments"]["why_batch"]["result"]["roofline"]
    assert "{" not in roof["basis"]
    prefill = next(p for p in roof["points"] if p["phase"] == "prefill")
    float_prefill = prefill["kernel"] == "float32 GEMM"  # the recording ran int4 with float32 copies for prompts
    assert rl.route_rule(roof["route"], float_prefill) in roof["basis"]


@pytest.mark.parametrize(
    "step_s, kernel_s, read, weights, held_by",
    [
        (10e-3, 8e-3, 1e6, 1e6, "kernel"),  # kernels fill 80 %, reading their 1 MB at 1 % of the bandwidth
        (10e-3, 1e-3, 8e7, 1e6, "memory"),  # the bytes at the bandwidth take 8 ms, the kernels 1 ms
        (10e-3, 8e-3, 7e7, 7e7, "kernel-streaming"),  # bytes 7 ms < kernels 8 ms, streamed at 87 % of it
        (10e-3, 8e-3, 3e7, 5e7, "kernel-streaming"),  # bytes fill 30 %: kernels at 62 %, not memory-bound
        (10e-3, 4e-3, 1e6, 1e6, "overhead"),  # neither floor fills half the step
    ],
)
def test_the_verdict_is_the_larger_floor_when_it_fills_half_the_step(step_s, kernel_s, read, weights, held_by):
    p = rl.judge(1e9, read, step_s, kernel_s, BANDWIDTH, "int4 kernel", weights)
    assert p["held_by"] == held_by
    assert p["verdict"] == rl.verdict(held_by, "int4 kernel")
    assert p["kernel_bandwidth_share"] == pytest.approx(weights / kernel_s / BANDWIDTH)


def test_the_threshold_sits_at_half_the_step():
    assert rl.judge(1e9, 1e3, 1.0, rl.HELD_BY_ROOF, BANDWIDTH, "float32 GEMM", 1e3)["held_by"] == "kernel"
    assert rl.judge(1e9, 1e3, 1.0, rl.HELD_BY_ROOF - 0.001, BANDWIDTH, "float32 GEMM", 1e3)["held_by"] == "overhead"


def test_memory_bound_needs_the_bytes_to_be_the_longer_floor():
    # kernels 8 ms of a 10 ms step, streaming their weights at 62 % of the copy bandwidth, bytes 3 ms
    p = rl.judge(1e9, 3e7, 10e-3, 8e-3, BANDWIDTH, "int4 kernel", 5e7)
    assert p["memory_ms"] < p["kernel_ms"] and p["held_by"] != "memory"
    assert "memory-bound" not in p["verdict"] and "fill most" not in p["verdict"]
    assert "half the copy bandwidth or more" in p["verdict"]


def test_an_int4_kernel_held_step_is_named_as_arithmetic_not_memory():
    assert "not by memory" in rl.verdict("kernel", "int4 kernel")
    assert rl.verdict("kernel", "float32 GEMM").startswith("compute-bound")
    assert rl.verdict("memory", "int4 kernel").startswith("memory-bound")


def test_the_models_own_kernels_are_timed(int4):
    kernels = kernels_mod.Kernels(int4)
    timed = kernels.measure([("layers", 4, True), ("head", 4, True), ("layers", 40, False)])
    assert kernels.layers == int4.model.config.num_hidden_layers
    assert all(s > 0 for s in timed.values())
    assert kernels.layer_flops(4) == 2 * 4 * kernels.layers * sum(
        m.in_features * m.out_features for m in kernels.projections
    )


def test_the_float32_routes_packed_projections_are_timed_in_their_joined_calls():
    """The float32 route's layers are oneDNN PackedLinear modules, not nn.Linear: all seven are counted, and
    q, k, v and gate, up run as their PackedSiblings' one call each, as the native step runs them."""
    kernels = kernels_mod.Kernels(loader.load("fake", "cpu", "float32"))
    assert len(kernels.projections) == 7 and kernels.layer_flops(1) > 0
    assert len(kernels_mod._step_calls(kernels.projections, kernels._x(1, kernels.projections[0].in_features))) == 4
    assert kernels.measure([("layers", 1, True)])[("layers", 1, True)] > 0


@pytest.mark.parametrize("route", ["int4", "int8"])
def test_the_bench_kernel_rates_measure(route):
    import torch

    got = rl.kernel_rate(torch.device("cpu"), route, n=64, repeats=2)
    assert got["flops"] == 2 * 64**3 and got["gflop_per_s"] > 0 and route in got["what"]


def test_the_kernels_run_every_layer_once_a_call_as_the_step_does(int4, monkeypatch):
    """Each layer's projections as the native step calls them: a sibling group in its one joined int4 call,
    every other projection by its own forward, every layer once, and no module call (a forward hook never
    fires); a group joins only where its widths fill the kernel's blocks (quantize._joinable)."""
    from model_runner.loading import quantize

    kernels = kernels_mod.Kernels(int4)
    mm, hooked = [], []
    real = quantize.int4_mm
    monkeypatch.setattr(quantize, "int4_mm", lambda *a: mm.append(a[0].shape) or real(*a))
    hooks = [m.register_forward_hook(lambda *_: hooked.append(1)) for layer in kernels.every_layer for m in layer]
    try:
        run = kernels._layer_call(4)
        mm.clear()  # the inputs' making is not the step
        run()
    finally:
        for h in hooks:
            h.remove()
    groups = {id(g): g for layer in kernels.every_layer for m in layer if (g := getattr(m, "siblings", None))}
    projections = sum(len(layer) for layer in kernels.every_layer)
    # one call a projection, less one for each sibling past the first of a joined group
    assert len(mm) == projections - sum(len(g.layers) - 1 for g in groups.values())
    assert all(shape[0] == 4 for shape in mm)
    assert hooked == []


def test_the_kernels_thread_shares_the_engines_torch_threads():
    """The floors are timed on the experiment's thread, the steps on the engine's worker: torch's intra-op
    thread count is the process's, so both run on the same threads."""
    import threading

    import torch

    seen = {}
    worker = threading.Thread(target=lambda: seen.setdefault("threads", torch.get_num_threads()))
    worker.start()
    worker.join()
    assert seen["threads"] == torch.get_num_threads()
