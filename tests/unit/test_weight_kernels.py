"""`python -m bench.weight_kernels`: each kernel it times computes x W^T (within its format's rounding), holds the
bytes its format says, and the comparison names the machine and its baseline."""

from __future__ import annotations

import json
import statistics

import pytest
import torch

from bench import weight_kernels

# The relative error a format's rounding allows on x W^T, random weights and inputs: float32's none but the
# sums' order; 16-bit floats' ~2^-8 (bfloat16) and 2^-11 (float16); 8 bits a scale; 4 bits, 16 levels a group.
TOLERANCE = {"float32": 1e-5, "float16": 3e-3, "bfloat16": 2e-2, "int8": 3e-2, "dynamic int8": 6e-2, "int4": 0.25}
AVAILABLE = [kernel for kernel in weight_kernels.KERNELS if kernel.available()]


@pytest.mark.parametrize("kernel", AVAILABLE, ids=lambda kernel: kernel.name)
def test_each_kernel_multiplies_by_the_weight_it_was_given(kernel):
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(48, 64, generator=generator)
    x = torch.randn(2, 64, generator=generator)
    run, _ = kernel.prepare(weight)
    y = run(x)
    exact = x @ weight.T
    assert y.shape == (2, 48) and y.dtype == torch.float32
    assert ((y - exact).norm() / exact.norm()).item() < TOLERANCE[kernel.name]


def test_each_format_holds_fewer_bytes_than_the_next_wider_one():
    held = {kernel.name: weight_kernels.step_calls(kernel, ((64, 48),), layers=2)[1] for kernel in AVAILABLE}
    weights = 2 * 64 * 48
    assert held["float32"] == 4 * weights and held["float16"] == held["bfloat16"] == 2 * weights
    assert weights < held["int8"] < 2 * weights  # a byte a weight and a scale a row
    assert weights / 2 < held["int4"] < weights  # half a byte a weight and a scale and zero a group of 32


def test_every_layer_gets_weights_of_its_own():
    calls, _ = weight_kernels.step_calls(weight_kernels.KERNELS[-1], ((64, 48),), layers=3)
    x = torch.ones(1, 64)
    outputs = [run(x) for run, _ in calls]
    assert len(calls) == 3 and not torch.equal(outputs[0], outputs[1]) and not torch.equal(outputs[1], outputs[2])


def ratio_bounds(ms: float, base: float, rounding: float = 5e-4) -> tuple[float, float]:
    """The ratio of two medians that read `ms` and `base` once rounded to the microsecond lies within these."""
    return (ms - rounding) / (base + rounding), (ms + rounding) / (base - rounding)


def test_the_comparison_names_the_machine_and_sets_each_kernel_beside_int4(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(weight_kernels, "SMOLLM2_CALLS", ((64, 48), (32, 64)))
    monkeypatch.setattr(weight_kernels, "SMOLLM2_LAYERS", 2)
    out = tmp_path / "kernels.json"
    assert weight_kernels.main(["--rows", "2", "--rounds", "3", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["command"] == f"python -m bench.weight_kernels --rows 2 --rounds 3 --json {out}"
    assert result["capability"] == torch.backends.cpu.get_cpu_capability() and result["threads"] >= 1
    assert result["rows"] == 2 and result["cpu"] and result["started_at"].endswith("+00:00")
    rows = {row["kernel"]: row for row in result["kernels"]}
    assert list(rows) == [kernel.name for kernel in AVAILABLE]
    assert rows["int4"]["vs_int4"] == 1.0
    for row in rows.values():
        assert len(row["ms_per_round"]) == 3 and row["ms_per_step"] > 0
        assert row["ms_per_step"] == pytest.approx(statistics.median(row["ms_per_round"]), abs=1e-3)
        low, high = ratio_bounds(row["ms_per_step"], rows["int4"]["ms_per_step"])
        assert low - 5e-4 <= row["vs_int4"] <= high + 5e-4  # the ratio of the medians before they were rounded
    assert "int4" in capsys.readouterr().out
