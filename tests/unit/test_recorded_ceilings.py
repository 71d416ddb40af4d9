"""No recorded step beats the ceiling of the kernels that ran it. The serving recording's roofline gives each
point its own ceiling (its kernels timed alone at its rows, or its bytes at the copy bandwidth); every
prefill recorded on the page (the walkthrough's run, the pricing and attention-cost experiments) is held to
the float32 GEMM's best rate on this model's layers, and every lone decode step to its kernels' own time."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from formulas import cost

ROOT = Path(__file__).resolve().parents[2]
SERVING = json.loads((ROOT / "static/data/serving-trace.json").read_text(encoding="utf-8"))
WALK = json.loads((ROOT / "static/data/trace-example.json").read_text(encoding="utf-8"))
ROOF = SERVING["experiments"]["why_batch"]["result"]["roofline"]
SHAPE = cost.Shape(**WALK["model"]["cost_shape"])
EXPERIMENTS = SERVING["experiments"]


def recorded_prefills() -> list[tuple[str, int, float]]:
    """(where, tokens, ms) of every prefill the page shows from a recording."""
    pre = next(e for e in WALK["events"] if e["type"] == "prefill_end")
    out = [("walkthrough trace", pre["tokens"], pre["ms"])]
    pricing = EXPERIMENTS["pricing"]["result"]
    out += [("pricing", pricing["prompt_tokens"], ms) for ms in pricing["prefill_ms"]]
    out += [
        ("attention_cost", p["prefill_tokens"], p["prefill_ms"])
        for p in EXPERIMENTS["attention_cost"]["result"]["points"]
    ]
    point = next(p for p in ROOF["points"] if p["phase"] == "prefill")
    out.append(("why_batch", point["tokens"], point.get("step_ms", 0)))
    return out


def test_the_recordings_share_one_model_shape_and_route():
    assert SHAPE.route == ROOF["route"] == SERVING["recorded_on"]["route"]["dtype_route"]


@pytest.mark.parametrize("point", ROOF["points"], ids=lambda p: f"{p['phase']}-{p.get('batch', p.get('tokens'))}")
def test_no_roofline_point_exceeds_its_own_ceiling(point):
    """A step cannot be faster than its own kernels alone, nor than its bytes at the copy bandwidth."""
    assert point["step_ms"] >= max(point["kernel_ms"], point["memory_ms"])
    assert point["flops_s"] <= point["attainable_flops_s"] * (1 + 1e-6)
    assert 0 < point["share"] <= 1


def test_each_point_names_the_kernel_its_route_ran():
    for p in ROOF["points"]:
        rows = p["tokens"] if p["phase"] == "prefill" else p["batch"]
        prompt_on_floats = p["phase"] == "prefill" and SHAPE.float_prefill and rows >= cost.FLOAT_ROWS
        assert p["kernel"] == ("float32 GEMM" if prompt_on_floats else f"{SHAPE.route} kernel")


@pytest.mark.parametrize("where, tokens, ms", recorded_prefills(), ids=lambda v: str(v))
def test_no_recorded_prefill_beats_the_float32_gemm(where, tokens, ms):
    """A prompt of 16 tokens or more runs float32's GEMM: no prefill shown on the page may beat that GEMM's
    best rate measured on this model's own layers (the serving roofline's peak)."""
    assert tokens >= cost.FLOAT_ROWS
    assert cost.prefill_flops(SHAPE, tokens) / (ms / 1000) <= ROOF["peak_flops_s"], where


def test_no_recorded_lone_decode_step_beats_its_kernels():
    """The batch-1 point's kernels alone (the int4 kernel and the head's int8 pass at one row) bound every
    lone decode step recorded on the page from below."""
    floor = next(p for p in ROOF["points"] if p["phase"] == "decode" and p["batch"] == 1)["kernel_ms"]
    walk = [e["step_ms"] for e in WALK["events"] if e["type"] == "token" and e["index"] > 0]
    pricing = EXPERIMENTS["pricing"]["result"]["decode_ms_median"]
    attention = [s["ms"] for p in EXPERIMENTS["attention_cost"]["result"]["points"] for s in p["steps"]]
    for where, steps in (("walkthrough", walk), ("pricing", pricing), ("attention_cost", attention)):
        assert min(steps) >= floor, (where, min(steps), floor)
    assert statistics.median(walk) >= floor
