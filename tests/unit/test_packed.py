"""The float32 route's linear layers on oneDNN's packed weights (model_runner/loading/packed.py): the same
function as nn.Linear within float32 rounding at every row count, the same weights counted, the head laid
input-major with its values and its tie to the embedding kept, which routes pack, and siblings (q, k, v;
gate, up) in one call: the separate calls' bits, four calls a layer instead of seven, no byte held twice."""

from __future__ import annotations

import threading

import pytest
import torch
from decoder_runs import Run
from numerics import CountCalls
from torch import nn

from model_runner.loading import loader
from model_runner.loading import packed as packed_module
from model_runner.loading.packed import (
    PROBE_ROWS,
    PackedLinear,
    PackedSiblings,
    available,
    join_siblings,
    joined_weights,
    joins_exactly,
    lay_in_major,
    pack_linears,
)
from model_runner.loading.quantize import weight_count_and_bytes
from model_runner.loading.routes import fake_route, resolve_route
from model_runner.loading.siblings import alike

TOLERANCE = dict(rtol=1e-5, atol=1e-5)  # float32: the same sums in another order

pytestmark = pytest.mark.skipif(not available(torch.device("cpu")), reason="this torch has no oneDNN")


@pytest.mark.parametrize("rows", [1, 3, 16, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_a_packed_layer_is_its_linear_layer_within_float32_rounding(rows, bias):
    torch.manual_seed(rows)
    dense = nn.Linear(96, 160, bias=bias)
    packed = PackedLinear(dense.weight, dense.bias)
    x = torch.randn(1, rows, 96)
    got = packed(x)
    assert got.shape == (1, rows, 160) and got.dtype == torch.float32
    assert torch.allclose(got, dense(x), **TOLERANCE)
    assert torch.allclose(packed(x.transpose(0, 1)[:, 0]), dense(x[0]), **TOLERANCE)  # 2-D rows too


def test_the_same_input_gives_the_same_bits_every_call():
    torch.manual_seed(0)
    packed = PackedLinear(torch.randn(64, 32))
    x = torch.randn(2, 32)
    assert torch.equal(packed(x), packed(x.clone()))


def test_the_head_laid_input_major_keeps_its_values_and_its_tie():
    torch.manual_seed(0)
    embedding = nn.Embedding(50, 16)
    weight = embedding.weight.detach().clone()
    lay_in_major(embedding.weight)
    assert embedding.weight.shape == (50, 16) and embedding.weight.stride() == (1, 50)
    assert torch.equal(embedding.weight, weight)
    ids = torch.tensor([3, 0, 49])
    assert torch.equal(embedding(ids), weight[ids])


def test_the_float32_route_packs_every_layer_but_the_head_and_counts_the_same_weights():
    before = loader.load("fake", dtype="auto")  # the test model's float32 as transformers holds it
    after = loader.load("fake", dtype="float32")
    model, reference = after.model.base, before.model.base
    layers = [m for m in model.modules() if isinstance(m, PackedLinear)]
    assert len(layers) == 2 * 7 and type(model.lm_head) is nn.Linear
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied: one tensor
    assert model.lm_head.weight.stride() == (1, model.config.vocab_size)  # input-major
    assert (after.facts.params, after.facts.weights_bytes) == (before.facts.params, before.facts.weights_bytes)
    assert after.facts.cost_shape == before.facts.cost_shape
    ids = torch.tensor([[5, 17, 99, 3]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, reference(ids).logits, **TOLERANCE)


@pytest.mark.parametrize("onednn", [True, False])
def test_weights_are_counted_once_whatever_holds_them(monkeypatch, onednn):
    """oneDNN's opaque copy, or without oneDNN the weight itself, in place of the layer's parameter."""
    monkeypatch.setattr(packed_module, "available", lambda device: onednn and device.type == "cpu")
    model = nn.Sequential(nn.Linear(32, 48), nn.Linear(48, 16, bias=False))
    model.get_output_embeddings = lambda: None
    params, size = weight_count_and_bytes(model)
    assert pack_linears(model) == 2
    assert model[0].packed.is_mkldnn == onednn
    assert weight_count_and_bytes(model) == (params, size)


def test_only_cpu_float32_routes_pack():
    cpu = torch.device("cpu")
    assert resolve_route("float32", cpu).packed and "oneDNN" in resolve_route("float32", cpu).reason
    assert not resolve_route("bfloat16", cpu).packed and not resolve_route("float16", cpu).packed
    assert not resolve_route("float32", torch.device("cuda")).packed
    assert not fake_route("auto").packed  # the test model's numbers stay put
    assert resolve_route("auto", cpu, bundled=False).packed


ONEDNN_LINEAR = torch.ops.mkldnn._linear_pointwise.default


def qkv_layers(bias: bool) -> tuple[list[PackedLinear], list[torch.Tensor]]:
    torch.manual_seed(11)
    weights = [torch.randn(out, 96) for out in (160, 48, 48)]
    return [PackedLinear(w, torch.randn(w.shape[0]) if bias else None) for w in weights], weights


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [*PROBE_ROWS, 7, 200])
def test_packed_siblings_give_the_separate_calls_bits_in_one_call(bias, rows):
    separate, weights = qkv_layers(bias)
    grouped, _ = qkv_layers(bias)
    joined = joined_weights(grouped, weights)
    assert joins_exactly(grouped, joined)
    siblings = PackedSiblings(grouped, joined)
    x = torch.randn(1, rows, 96)
    with CountCalls(ONEDNN_LINEAR) as counted:
        got = [layer(x) for layer in grouped]
    assert counted.calls == 1
    assert [g.shape for g in got] == [(1, rows, 160), (1, rows, 48), (1, rows, 48)]
    assert all(torch.equal(g, s(x)) for g, s in zip(got, separate))
    assert torch.equal(siblings.joined(x), torch.cat(got, dim=-1))
    assert siblings._held.input is None  # all three took theirs: no output held on


def test_packed_siblings_hold_no_byte_twice():
    layers, weights = qkv_layers(bias=True)
    model = nn.ModuleList(layers)
    before = weight_count_and_bytes(model)
    PackedSiblings(layers, joined_weights(layers, weights))
    assert all(layer.packed is None for layer in layers)
    assert weight_count_and_bytes(model) == before


def test_another_thread_never_takes_this_threads_held_outputs():
    layers, weights = qkv_layers(bias=False)
    separate, _ = qkv_layers(bias=False)
    PackedSiblings(layers, joined_weights(layers, weights))
    x = torch.randn(1, 96)
    layers[0](x)  # this thread holds the outputs for x, two untaken
    seen = {}
    worker = threading.Thread(target=lambda: seen.update(out=layers[1](x)))
    worker.start()
    worker.join()
    assert torch.equal(seen["out"], separate[1](x))
    assert layers[0].siblings._held.untaken == 2


def test_siblings_whose_joined_call_would_differ_stay_apart(monkeypatch):
    """The probe decides: where the joined call's sums differ on this CPU, or widths or biases differ, each
    layer keeps its own call."""
    layers, weights = qkv_layers(bias=False)
    attention = nn.Module()
    for name, layer in zip(("q_proj", "k_proj", "v_proj"), layers):
        setattr(attention, name, layer)
    real = packed_module.packed_linear
    monkeypatch.setattr(packed_module, "packed_linear", lambda x, w, b: real(x, w, b) + (w is not layers[0].packed))
    assert not joins_exactly(layers, joined_weights(layers, weights))
    assert join_siblings(attention, {id(layer): w for layer, w in zip(layers, weights)}) == 0
    assert all(layer.siblings is None and layer.packed is not None for layer in layers)
    monkeypatch.setattr(packed_module, "packed_linear", real)
    mixed = [layers[0], PackedLinear(torch.randn(48, 96), torch.randn(48)), layers[2]]
    assert not alike(mixed)  # one biased, two not
    attention.k_proj = mixed[1]
    assert join_siblings(attention, {id(layer): w for layer, w in zip(mixed, weights)}) == 0


def fake_float32():
    return loader.load("fake", dtype="float32").model


def test_the_float32_route_runs_four_calls_a_layer_and_the_native_step_gives_transformers_bits():
    model = fake_float32()
    base = model.base
    layers = base.config.num_hidden_layers
    groups = {id(m.siblings) for m in base.modules() if isinstance(m, PackedLinear) and m.siblings is not None}
    assert len(groups) == 2 * layers  # q, k, v and gate, up of every layer
    native, reference = Run(model, "native"), Run(model, "transformers")
    steps = [[("a", [5, 6, 7, 8, 9]), ("b", [11, 12, 13])], [("a", [20])], [("b", [21])]]
    for rows in steps:
        with CountCalls(ONEDNN_LINEAR) as counted:
            got = native.step(rows)
        assert counted.calls == 4 * layers
        assert torch.equal(got, reference.step(rows)), rows
    for key in ("a", "b"):
        assert torch.equal(native.kv(key), reference.kv(key))
