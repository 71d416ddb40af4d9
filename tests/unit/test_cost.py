"""formulas.cost against the golden cases in static/data/cost_golden.json (tests/browser/test_cost_js.py
checks the JS twin against the same file), and the golden shapes against the models they name."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from formulas import cost
from model_runner.loading import loader
from model_runner.loading.model_shape import shape_from_model, shape_of
from model_runner.loading.routes import float_prefill_for

GOLDEN = json.loads((Path(__file__).resolve().parents[2] / "static/data/cost_golden.json").read_text())


def golden_shape(name: str) -> cost.Shape:
    return cost.Shape(**{k: v for k, v in GOLDEN["shapes"][name].items() if k != "source"})


@pytest.fixture(scope="module", params=["float32", "int4", "int8"])
def fake(request):
    return loader.load("fake", "cpu", request.param)


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: c["id"])
def test_every_golden_case(case):
    assert getattr(cost, case["figure"])(golden_shape(case["shape"]), *case["args"]) == case["value"]


@pytest.mark.parametrize("case", GOLDEN["decode_tokens_per_s"], ids=lambda c: c["id"])
def test_decode_tokens_per_s_golden(case):
    assert cost.decode_tokens_per_s(case["token_times_s"]) == case["value"]


@pytest.mark.parametrize("case", GOLDEN["attainable_flops_s"], ids=lambda c: c["id"])
def test_attainable_flops_golden(case):
    assert cost.attainable_flops_s(*case["args"]) == case["value"]


def test_the_golden_tiny_shapes_are_the_fake_model_as_loaded(fake):
    """The golden shapes hold the weights as stored; whether int4 also keeps float32 copies for prompts
    depends on the CPU it loads on (model_runner/loading/routes.py), so that one field is read from it."""
    expected = golden_shape(f"tiny-{fake.facts.weights_dtype}")
    if expected.route == "int4":
        expected = dataclasses.replace(
            expected, float_prefill=float_prefill_for(torch.backends.cpu.get_cpu_capability())
        )
    assert shape_of(fake) == expected


def test_the_formula_for_held_bytes_is_what_the_tensors_hold(fake):
    """The route's byte formula (int4 groups with scale and minimum, int8 rows with a scale) against the
    bytes the loaded model's tensors occupy, counted by model_runner/loading/quantize.py."""
    assert cost.weight_bytes_held(shape_of(fake)) == fake.facts.weights_bytes


def test_quantizing_leaves_the_multiplied_weights_alone():
    float32, int4 = (shape_of(loader.load("fake", "cpu", r)) for r in ("float32", "int4"))
    assert int4.matmul_params == float32.matmul_params and int4.quantized_params == int4.matmul_params
    # the same weights multiplied; the quantized head also scores 32 candidates again in float32
    assert cost.decode_flops(int4, 10) - cost.decode_flops(float32, 10) == 2 * cost.RESCORED * 32
    assert float32.tied_embeddings and int4.tied_embeddings  # the head rescores from the embedding's own tensor


def test_the_cost_models_constants_are_the_quantized_layers():
    from model_runner.loading import quantize

    assert (cost.INT4_GROUP, cost.FLOAT_ROWS, cost.RESCORED) == (quantize.GROUP, quantize.FLOAT_ROWS, quantize.RESCORED)
    assert quantize.MM_DTYPE.itemsize == cost.SCALE_BYTES  # the scales are stored in the kernels' dtype


def test_float_weights_kept_for_prefill_are_held_and_read_by_long_calls():
    """int4 under AVX2 keeps the layers' float32 weights: a call of FLOAT_ROWS rows or more reads them."""
    import torch

    from model_runner.loading import quantize

    model = loader.load("fake", "cpu", "auto").model.base  # float32 as transformers holds it (not packed)
    quantize.quantize_int4(model, keep_float=True)
    route = loader.DtypeRoute("int4", torch.float32, "int4", "a test", float_prefill=True)
    facts = loader.read_facts(model, "fake", "fake", torch.device("cpu"), route)
    shape = shape_from_model(model, facts)
    assert shape == cost.Shape(**{**golden_shape("tiny-int4").to_dict(), "float_prefill": True})
    assert cost.weight_bytes_held(shape) == facts.weights_bytes
    short, long = cost.layer_bytes_read(shape, cost.FLOAT_ROWS - 1), cost.layer_bytes_read(shape, cost.FLOAT_ROWS)
    assert long - short == 18_432 * 4 - cost.quantized_bytes(shape)
    # A decode step of FLOAT_ROWS requests is no prompt: it reads the int4 weights, as the model runs it.
    assert cost.layer_bytes_read(shape, cost.FLOAT_ROWS, decode=True) == short
    assert cost.decode_step_bytes(shape, cost.FLOAT_ROWS, 0) == cost.weight_bytes_read(
        shape, cost.FLOAT_ROWS, decode=True
    )


def test_batch_one_decode_on_the_default_route_is_two_times_all_weights():
    """Quantizing unties the head, and the old count subtracted the embedding twice (77.9M
    "non-embedding" weights, decode FLOPs 21-26 % low). Batch-1 decode is 2 x 134.5M FLOPs plus attention."""
    shape = golden_shape("smollm2-135m-int4")
    assert shape.non_embedding_params == pytest.approx(106.2e6, rel=1e-3)
    context = 100
    attention = 4 * 30 * 9 * 64 * (context + 1)  # layers x heads x head dim, scores and weighted sum
    assert cost.decode_flops(shape, context) == pytest.approx(2 * 134.5e6 + attention, rel=0.03)
    # Its bytes: the layers as int4 stores them, the head's int8 pass and 32 rescored float32 rows, one
    # float32 embedding row, the KV cache; not the 113 MB float32 embedding.
    int4_layers = 106_168_320 // 2 + 106_168_320 // 32 * 4
    head = 49_152 * 576 + 49_152 * 2 + 32 * 576 * 4
    reads = 35_136 * 4 + int4_layers + head + 576 * 4 + shape.kv_bytes_per_token * context
    assert cost.decode_step_bytes(shape, 1, context) == reads


def test_the_untouched_embedding_is_not_read_but_one_row_per_token_is():
    shape = golden_shape("smollm2-135m-int8")
    row, rescored = 576 * 4, 32 * 576 * 4
    assert cost.weight_bytes_read(shape, 15) - cost.weight_bytes_read(shape, 1) == 14 * (row + rescored)
    assert cost.weight_bytes_held(shape) - cost.weight_bytes_read(shape) == 49_152 * 576 * 4 - row - rescored


def test_sixteen_rows_of_logits_run_the_float_head():
    shape = golden_shape("smollm2-135m-int4")
    assert cost.head_bytes_read(shape, 15) == 49_152 * 576 + 49_152 * 2 + 15 * 32 * 576 * 4
    assert cost.head_bytes_read(shape, 16) == 49_152 * 576 * 4
    # A decode step's 16 rows of logits are 16 requests' next tokens, not a prompt: the int8 pass stays.
    assert cost.head_bytes_read(shape, 16, decode=True) == 49_152 * 576 + 49_152 * 2 + 16 * 32 * 576 * 4


def test_a_tied_float_head_reads_the_embedding_once():
    shape = golden_shape("smollm2-135m-float32")
    assert cost.weight_bytes_read(shape, 8) == cost.weight_bytes_held(shape) == (134_515_008) * 4


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda s: cost.prefill_flops(s, 0), "tokens must be a whole number of at least 1, got 0"),
        (lambda s: cost.decode_flops(s, -1), "context must be a number of at least 0, got -1"),
        (lambda s: cost.decode_step_bytes(s, 0, 5), "batch must be a whole number of at least 1, got 0"),
        (lambda s: cost.weight_bytes_read(s, 1.5), "tokens must be a whole number of at least 1, got 1.5"),
    ],
)
def test_bad_counts_name_the_field_and_the_limit(call, message):
    with pytest.raises(ValueError, match=message):
        call(golden_shape("tiny-float32"))


def test_a_shape_that_cannot_be_is_refused():
    fields = {k: v for k, v in GOLDEN["shapes"]["tiny-int4"].items() if k != "source"}
    with pytest.raises(ValueError, match="route must be one of"):
        cost.Shape(**{**fields, "route": "int3"})
    with pytest.raises(ValueError, match="only the int4 route keeps float32 weights"):
        cost.Shape(**{**fields, "route": "int8", "float_prefill": True})
    with pytest.raises(ValueError, match="holds no quantized weights"):
        cost.Shape(**{**fields, "route": "float32"})
