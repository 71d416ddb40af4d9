"""The float32 route's linear layers on oneDNN's packed weights (model_runner/loading/packed.py): the same
function as nn.Linear within float32 rounding at every row count, the same weights counted, the head laid
input-major with its values and its tie to the embedding kept, and which routes pack."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from model_runner.loading import loader
from model_runner.loading import packed as packed_module
from model_runner.loading.packed import PackedLinear, available, lay_in_major, pack_linears
from model_runner.loading.quantize import weight_count_and_bytes
from model_runner.loading.routes import fake_route, resolve_route

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
