"""The cost model on the product's model as it runs (the CPU's default route): the golden SmolLM2 shape is
what the loaded model holds, its held bytes are what its tensors occupy, and the roofline places batch-1
decode at 2 x 134.5M FLOPs per token plus attention."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from formulas import cost
from model_runner.loading.model_shape import shape_of
from serving_experiments import roofline

GOLDEN = json.loads((Path(__file__).resolve().parents[2] / "static/data/cost_golden.json").read_text())


def test_the_golden_shape_is_the_loaded_model(real_engine):
    loaded = real_engine.local.loaded
    shape = shape_of(loaded)
    name = f"smollm2-135m-{shape.route}" + ("-float-prefill" if shape.float_prefill else "")  # per the CPU's route
    golden = {k: v for k, v in GOLDEN["shapes"][name].items() if k != "source"}
    assert shape == cost.Shape(**golden)
    assert cost.weight_bytes_held(shape) == loaded.facts.weights_bytes


def test_batch_one_decode_on_the_default_route(real_engine, monkeypatch):
    loaded = real_engine.local.loaded
    monkeypatch.setattr(roofline, "ceilings", lambda device, dtype: (1e11, 1e10))
    context, step_ms = 40, 25.0
    result = roofline.roofline(loaded, {"tokens": 36, "ms": 100.0}, [{"batch": 1, "context": context, "ms": step_ms}])
    decode = result["points"][1]
    flops = decode["flops_s"] * step_ms / 1000
    attention = 4 * 30 * 9 * 64 * (context + 1)
    assert flops == pytest.approx(2 * 134.5e6 + attention, rel=0.03)
    shape = shape_of(loaded)
    if shape.quantized:  # the 113 MB float32 embedding is held but not read: one row, and 32 rescored rows;
        # the float32 layer copies kept for prompts (float_prefill) are held but not read by a decode step
        kept_for_prompts = 106_168_320 * 4 if shape.float_prefill else 0
        reads = loaded.facts.weights_bytes - 49_152 * 576 * 4 - kept_for_prompts + 576 * 4 + 32 * 576 * 4
    else:  # a tied float head reads the embedding whole
        reads = loaded.facts.weights_bytes
    assert flops / decode["intensity"] == pytest.approx(reads + shape.kv_bytes_per_token * context, rel=1e-3)
