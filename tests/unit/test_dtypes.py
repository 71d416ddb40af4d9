"""Every --dtype route on the test model: what loads, what /api/model-style facts say runs, that the
KV live check (measured bytes == formula bytes) holds and the scripted answer is unchanged; the int8
layer against its dequantized reference; the head's float32 logits; int4's float32 prefill; how `auto`
picks from the CPU; `kvscope bench --dtypes`."""

from __future__ import annotations

import argparse
import json
import re

import pytest
import torch
from kvscope_testkit import ask, events_of
from torch import nn

from bench import dtypes as bench_dtypes
from model_runner.loading import loader
from model_runner.loading.fake import ANSWER
from model_runner.loading.quantize import (
    FLOAT_ROWS,
    RESCORED,
    Int4Linear,
    Int8Linear,
    RescoredHead,
    kernel_step,
    mixed_kernel_rows,
    quantize_int4,
    quantize_int8,
    weight_count_and_bytes,
)
from model_runner.loading.routes import float_prefill_for
from model_runner.local.scheduler import Work
from model_runner.protocol.errors import UserError
from model_runner.shared.sequence import Sequence

ROUTES = {  # --dtype → (weights dtype, KV dtype, bytes per KV element, quantized)
    "float32": ("float32", "float32", 4, False),
    "bfloat16": ("bfloat16", "bfloat16", 2, False),
    "float16": ("float16", "float16", 2, False),
    "int8": ("int8", "float32", 4, True),
    "int4": ("int4", "float32", 4, True),
}


@pytest.mark.parametrize("dtype", sorted(ROUTES))
def test_each_route_says_exactly_what_runs(dtype):
    weights, kv, element, quantized = ROUTES[dtype]
    facts = loader.load("fake", dtype=dtype).facts
    assert (facts.weights_dtype, facts.kv_dtype, facts.bytes_per_element) == (weights, kv, element)
    assert facts.dtype_route == dtype and facts.dtype_reason.startswith(f"--dtype {dtype}")
    # int4 says where its prompts run (the float32 weights on AVX2 and AVX-512 CPUs)
    kept = dtype == "int4" and float_prefill_for(torch.backends.cpu.get_cpu_capability())
    assert ("prompts on the float32 weights" in facts.dtype_reason) == kept
    assert (facts.quantization != "none") == quantized
    assert facts.kv_bytes_per_token == 2 * facts.layers * facts.kv_heads * facts.head_dim * element
    assert facts.to_dict()["quantization"] == facts.quantization  # what /api/model sends


def _head_bytes(head: RescoredHead) -> int:
    """The head's int8 pass (its float weights are the embedding's own tensor, counted with it)."""
    return head.approximate.weight.numel() + 2 * head.approximate.scales.numel()


@pytest.mark.parametrize(("capability", "float_prefill"), [("AVX512", True), ("AVX2", True), ("DEFAULT", False)])
def test_int4_keeps_the_parameter_count_and_counts_every_byte_it_holds(monkeypatch, capability, float_prefill):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    f32, loaded = loader.load("fake", dtype="float32").facts, loader.load("fake", dtype="int4")
    int4, model = loaded.facts, loaded.model.base
    assert int4.params == f32.params
    assert isinstance(model.lm_head, RescoredHead) and model.model.embed_tokens.weight.dtype == torch.float32
    assert model.lm_head.float_weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # no copy
    layers = [m for m in model.modules() if isinstance(m, Int4Linear)]
    assert len(layers) == 2 * 7 and not [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert all((m.float_weight is not None) == float_prefill for m in layers)
    floats = sum(p.numel() * 4 for p in model.parameters())
    packed = sum(m.weight.numel() + 2 * m.scales_zeros.numel() for m in layers)
    kept = sum(m.float_weight.numel() * 4 for m in layers if m.float_weight is not None)
    assert int4.weights_bytes == floats + packed + kept + _head_bytes(model.lm_head)
    assert ("float32 weights" in int4.quantization) == float_prefill and "float32 logits" in int4.quantization


def test_int4_recovers_q4_1_weights_exactly():
    """Weights made the way llama.cpp's Q4_1 makes them (per 32: d = (max - min) / 15, q in 0..15) come
    back exactly: the int4 layer's output equals the same weights in float (up to bf16 scales)."""
    torch.manual_seed(1)
    q = torch.randint(0, 16, (48, 64, 32)).float()
    q[..., 0], q[..., 1] = 0, 15  # Q4_1: the group's min and max sit at 0 and 15
    step = torch.rand(48, 64, 1).bfloat16().float() / 10  # representable scales, so only rounding of m+8d is left
    low = -8 * step  # zero = m + 8d = 0 exactly
    weight = (q * step + low).reshape(48, 2048)
    layer = Int4Linear(weight)
    x = torch.randn(2, 2048).bfloat16().float()
    assert torch.allclose(layer(x), x @ weight.T, rtol=1e-2, atol=1e-1)
    approx = Int8Linear(weight)
    assert (layer(x) - x @ weight.T).abs().max() < (approx(x) - x @ weight.T).abs().max()


def test_int8_keeps_the_parameter_count_and_stores_fewer_bytes():
    f32, int8 = loader.load("fake", dtype="float32").facts, loader.load("fake", dtype="int8").facts
    assert int8.params == f32.params  # the untied int8 head is a copy of the embedding, not more weights
    model = loader.load("fake", dtype="int8").model.base
    assert isinstance(model.lm_head, RescoredHead) and model.model.embed_tokens.weight.dtype == torch.float32
    assert not [m for m in model.modules() if isinstance(m, nn.Linear)]  # every layer of the fake's width
    layers = [m for m in model.modules() if isinstance(m, Int8Linear)]  # the head's int8 pass among them
    floats = sum(p.numel() * 4 for p in model.parameters())  # embedding and norms
    assert int8.weights_bytes == floats + sum(m.weight.numel() + 2 * m.scales.numel() for m in layers)
    assert int8.weights_bytes < f32.weights_bytes * 0.75


@pytest.mark.parametrize("dtype", ["auto", *sorted(ROUTES)])
def test_every_route_serves_the_scripted_answer_with_the_live_kv_check(engine_factory, dtype):
    engine = engine_factory(model="fake", dtype=dtype)
    events = events_of(engine.submit(ask(max_new_tokens=24)))
    assert events[-1]["type"] == "finished"
    assert events[-1]["text"] == ANSWER.encode()[:24].decode()
    tokens = [e for e in events if e["type"] == "token"]
    assert tokens and all(t["cache_bytes_measured"] == t["cache_bytes_formula"] for t in tokens)
    assert engine.pool.computed_bytes(1) == engine.facts.kv_bytes_per_token


@pytest.mark.parametrize("in_features", [16, 48, 576])
def test_int8_linear_matches_its_dequantized_weights(in_features):
    torch.manual_seed(in_features)
    dense = nn.Linear(in_features, 40, bias=True)
    layer = Int8Linear(dense.weight, dense.bias)
    x = torch.randn(3, 5, in_features)  # any leading shape
    dequantized = layer.weight.float() * layer.scales.float()[:, None]
    reference = x.to(torch.bfloat16).float() @ dequantized.T + dense.bias
    got = layer(x)
    assert got.shape == (3, 5, 40) and got.dtype == torch.float32
    assert torch.allclose(got, reference, atol=0.05, rtol=0.02)
    error = (dequantized - dense.weight).abs().max(dim=1).values  # per row, half a step at most
    assert torch.all(error <= layer.scales.float() * 0.5 + 1e-6)


def test_widths_the_kernels_cannot_take_stay_float():
    model = nn.Sequential(nn.Linear(64, 24), nn.Linear(32, 16))  # int4: 24 outputs are not sixteens
    model.config = argparse.Namespace(tie_word_embeddings=False)
    assert quantize_int4(model) == 1
    assert type(model[0]) is nn.Linear and isinstance(model[1], Int4Linear)
    model = nn.Sequential(nn.Linear(32, 24), nn.Linear(24, 16))  # int8: 24 inputs are not sixteens
    model.config = argparse.Namespace(tie_word_embeddings=False)
    assert quantize_int8(model) == 1
    assert isinstance(model[0], Int8Linear) and type(model[1]) is nn.Linear
    params, size = weight_count_and_bytes(model)
    assert params == 32 * 24 + 24 + 24 * 16 + 16
    assert size == 32 * 24 + 24 * 2 + 24 * 4 + (24 * 16 + 16) * 4  # int8, bf16 scales, float bias, float layer


@pytest.mark.parametrize(
    ("capability", "route"), [("AVX512", "int4"), ("AVX2", "int4"), ("DEFAULT", "float32"), ("SVE256", "float32")]
)
def test_auto_on_a_cpu_picks_by_the_cpus_vector_capability(monkeypatch, capability, route):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    chosen = loader.resolve_route("auto", torch.device("cpu"))
    assert chosen.name == route and chosen.quant == ("" if route == "float32" else route)
    assert capability in chosen.reason
    assert chosen.float_prefill == (route == "int4")  # prompts run on float32's weights wherever int4 runs
    assert ("prompts on the float32 weights" in chosen.reason) == chosen.float_prefill
    assert chosen.compute == torch.float32  # either way the KV cache stays float32
    other = loader.resolve_route("auto", torch.device("cpu"), bundled=False)  # a --model of float weights
    assert other.name == "float32" and not other.quant


def test_the_head_gives_float32_logits_for_its_leading_candidates_and_argmax():
    torch.manual_seed(3)
    weight = torch.randn(4096, 64) * 0.2
    head = RescoredHead(weight)
    x = torch.randn(5, 64)
    exact = x @ weight.T
    got = head(x)
    top = exact.topk(8, dim=-1).indices
    assert got.dtype == torch.float32 and torch.equal(got.argmax(-1), exact.argmax(-1))
    assert torch.allclose(got.gather(-1, top), exact.gather(-1, top), rtol=0, atol=1e-5)  # float32, not int8
    approximate = head.approximate(x).float()
    assert (approximate.gather(-1, top) - exact.gather(-1, top)).abs().max() > 1e-3  # what rescoring removes
    # A near-tie finer than bfloat16 or float16 can hold (1e-4 at 14) is kept in its order.
    tie = torch.zeros(3, 64)
    tie[0, 0], tie[1, 0], tie[2, 0] = 14.0, 14.0001, 13.9999
    rows = RescoredHead(tie)(torch.eye(64)[:1])
    assert rows.argmax(-1).item() == 1 and rows[0, 1] > rows[0, 0] > rows[0, 2]
    many = torch.randn(FLOAT_ROWS, 64)  # a prompt's rows: float32's GEMM for every logit
    assert torch.equal(head(many), nn.functional.linear(many, weight))
    outside = exact.topk(RESCORED + 1, dim=-1).indices[:, -1:]  # beyond the rescored: the int8 pass's values
    assert torch.equal(got.gather(-1, outside), approximate.gather(-1, outside))


def test_int4_runs_long_inputs_on_the_float_weights_and_short_ones_on_int4():
    torch.manual_seed(4)
    weight = torch.randn(48, 64)
    layer = Int4Linear(weight, keep_float=True)
    long_input = torch.randn(1, FLOAT_ROWS, 64)  # a prompt: float32's own arithmetic
    assert torch.equal(layer(long_input), nn.functional.linear(long_input, weight))
    short = torch.randn(1, 3, 64)  # a decode step's rows: the int4 kernel, so not float32's exact sums
    assert not torch.equal(layer(short), nn.functional.linear(short, weight))
    assert torch.equal(layer(short), Int4Linear(weight)(short))


def test_a_decode_step_stays_on_the_kernels_however_many_requests_share_it():
    """16 requests decoding together are 16 rows, not a prompt: inside kernel_step() they run the int4
    kernel and the head's int8 pass (a batch of 16 on the float32 copies was 3x slower than 8)."""
    torch.manual_seed(5)
    weight = torch.randn(48, 64)
    layer, batch = Int4Linear(weight, keep_float=True), torch.randn(FLOAT_ROWS, 64)
    with kernel_step():
        assert torch.equal(layer(batch), Int4Linear(weight)(batch))
        head_rows = RescoredHead(weight)(batch)
    assert not torch.equal(head_rows, nn.functional.linear(batch, weight))  # the int8 pass outside the top
    assert torch.equal(layer(batch), nn.functional.linear(batch, weight))  # outside it: a prompt's rows


@pytest.mark.parametrize(
    ("capability", "rows"), [("AVX512", 40), ("avx512", 40), ("AVX2", FLOAT_ROWS - 1), ("DEFAULT", FLOAT_ROWS - 1)]
)
def test_how_large_a_mixed_step_stays_on_the_kernels_follows_the_cpus_kernels(monkeypatch, capability, rows):
    """Under AVX2 float32 already wins from about 16 rows, so a mixed step there keeps the float32 rule."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    assert mixed_kernel_rows() == rows


def _work(kind: str, tokens: int, cached: int, chunked: bool = True) -> Work:
    seq = Sequence(id=kind, params=ask("hi"), key=kind, prompt_ids=[65] * max(tokens, 1))
    seq.cached = cached
    return Work(seq, [66] * tokens, kind, True, chunked=chunked and kind == "prefill")


@pytest.mark.parametrize(("capability", "limit"), [("AVX512", 40), ("AVX2", FLOAT_ROWS - 1)])
def test_which_steps_run_on_the_kernels(monkeypatch, capability, limit):
    from model_runner.local.step.forward import on_kernels

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    decodes = [_work("decode", 1, 5) for _ in range(8)]
    assert on_kernels(decodes * 8)  # a decode batch, however wide
    assert on_kernels(decodes + [_work("prefill", limit - 8, 0)])  # a mixed step at the limit
    assert not on_kernels(decodes + [_work("prefill", limit - 7, 0)])  # one row past it
    assert not on_kernels([_work("prefill", 4, 0)])  # a prompt alone: the float32 rule (from FLOAT_ROWS rows)
    # A whole prompt (no chunked prefill) beside decodes keeps float32's own KV cache, however small the step.
    assert not on_kernels(decodes + [_work("prefill", limit - 8, 0, chunked=False)])


def _rows_on_the_float_weights(monkeypatch, work) -> list[tuple[int, bool]]:
    """For each quantized layer's call in one BatchForward step over `work` (the head's included): its rows and
    whether it ran on the float32 weights."""
    from model_runner.loading import quantize
    from model_runner.local.kv_cache import PagedKVPool
    from model_runner.local.model.decoders import decoder_for
    from model_runner.local.step.forward import BatchForward

    loaded = loader.load("fake", "cpu", "int4")
    monkeypatch.setattr(quantize, "_prompt_rows", spy := _Spy(quantize._prompt_rows))
    pool = PagedKVPool(loaded.model, loaded.facts, num_blocks=64, block_size=16, max_batch_tokens=512)
    forward = BatchForward(loaded.model, pool, decoder_for(loaded.model, pool))
    with torch.inference_mode():
        for seq, tokens, kind in work:
            if seq.cached == 0 and kind == "decode":  # give it a past first, in a step of its own
                assert pool.reserve(seq, len(seq.prompt_ids))
                forward([Work(seq, seq.prompt_ids, "prefill", True)])
        spy.calls.clear()
        for seq, tokens, _ in work:
            assert pool.reserve(seq, len(tokens))
        forward([Work(seq, tokens, kind, True, chunked=kind == "prefill") for seq, tokens, kind in work])
    return spy.calls


class _Spy:
    def __init__(self, wrapped):
        self.wrapped, self.calls = wrapped, []

    def __call__(self, flat):
        self.calls.append((flat.shape[0], self.wrapped(flat)))
        return self.calls[-1][1]


def test_a_small_step_mixing_a_chunk_with_decodes_runs_on_the_kernels_and_a_large_one_on_float32(monkeypatch):
    """A class's usual step (the rest of a prompt after its cached prefix, beside decodes) is cheaper on the
    int4 kernel than on float32's GEMM while it is small; a prompt alone, or a large mixed step, is not."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")  # 40 rows
    decoding = [Sequence(id=f"d{i}", params=ask("hi"), key=f"d{i}", prompt_ids=[65, 66, 67]) for i in range(15)]

    def mixed(chunk: int) -> list:
        chunked = Sequence(id="c", params=ask("hi"), key="c", prompt_ids=list(range(70, 70 + chunk)))
        return [(seq, [68], "decode") for seq in decoding] + [(chunked, chunked.prompt_ids, "prefill")]

    small = _rows_on_the_float_weights(monkeypatch, mixed(20))  # 35 rows, 16 of them wanting logits
    assert {rows for rows, _ in small} == {35, 16} and not any(on_float for _, on_float in small)
    for seq in decoding:
        seq.cached = 0
    large = _rows_on_the_float_weights(monkeypatch, mixed(30))  # 45 rows
    assert {rows for rows, _ in large} == {45, 16} and all(on_float for _, on_float in large)
    alone = Sequence(id="p", params=ask("hi"), key="p", prompt_ids=list(range(70, 90)))
    prompt = _rows_on_the_float_weights(monkeypatch, [(alone, alone.prompt_ids, "prefill")])
    assert {(20, True), (1, False)} == set(prompt)  # its layers on float32; the head's one row on the kernels


def test_bad_and_misplaced_dtypes_are_refused_naming_the_field():
    with pytest.raises(UserError, match=r"--dtype must be auto, float32, bfloat16 or float16 \(or int4 or int8") as bad:
        loader.resolve_route("float8", torch.device("cpu"))
    assert bad.value.field == "dtype"
    with pytest.raises(UserError, match="--dtype int8 is a CPU route") as gpu:
        loader.resolve_route("int8", torch.device("cuda"))
    assert gpu.value.field == "dtype"
    with pytest.raises(UserError, match="--dtypes takes two or more different values"):
        bench_dtypes.parse_routes("float32")
    with pytest.raises(UserError, match="got 'float32,fp4'"):
        bench_dtypes.parse_routes("float32,fp4")


def test_agreement_counts_identical_answers_and_first_differences():
    reference = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 9], None]
    got = [[1, 2, 3, 4], [5, 6, 0, 8], [9, 9, 9], [1]]
    a = bench_dtypes.agreement(got, reference)
    assert (a["identical"], a["compared"], a["identical_share"]) == (1, 3, round(1 / 3, 4))
    assert a["first_diff"] == [{"request": 1, "token": 2}, {"request": 2, "token": 2}]
    assert a["tokens_before_divergence_share"] == round((4 + 2 + 2) / 10, 4)


def test_bench_dtypes_runs_both_routes_in_one_run(tmp_path, capsys):
    out = tmp_path / "dtypes.json"
    args = argparse.Namespace(
        dtypes="float32,int8", model="fake", device="auto", prompt_lens=(24,), output_lens=(6,), concurrency=(2,),
        repeats=1, json=str(out), via_websocket=None, batching=False, class_scenario=False, quick=False,
    )  # fmt: skip
    assert bench_dtypes.run_dtypes(args) == 0
    report = json.loads(out.read_text())
    rows = report["routes"]
    assert list(rows) == ["float32", "int8"] and report["settings"]["quality_prompts"] >= 20
    assert rows["int8"]["facts"]["weights_dtype"] == "int8"
    assert rows["int8"]["tensor_kv_bytes_per_token"] == rows["int8"]["facts"]["kv_bytes_per_token"]
    assert rows["int8"]["agreement"]["identical_share"] == 1.0  # the test model's answer is scripted
    for key in ("lone_int8_over_float32", "batched_int8_over_float32"):
        assert report["ratios"][key]["value"] > 0 and report["ratios"][key]["target"] is not None
    printed = capsys.readouterr().out
    assert "lone client: decode tokens/s, int8 / float32" in printed and "identical" in printed


def test_serve_s_preflight_on_cuda_leaves_cuda_uninitialised_for_gunicorn_s_fork(monkeypatch):
    # Asking the GPU about bf16 starts CUDA in the parent; gunicorn's forked worker then cannot load
    # the model ("Cannot re-initialize CUDA in forked subprocess"), as seen on an H200.
    def starts_cuda():
        raise AssertionError("preflight started CUDA before the fork")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", starts_cuda)
    loader.preflight("default", "cuda", "auto")
    with pytest.raises(UserError, match="--dtype int8 is a CPU route"):  # a named dtype is still checked
        loader.preflight("default", "cuda", "int8")


def test_bench_dtypes_compares_the_native_decoder_with_transformers_on_one_route(tmp_path, capsys):
    out = tmp_path / "decoders.json"
    args = argparse.Namespace(
        dtypes="float32:transformers,float32:native", model="fake", device="auto", prompt_lens=(24,),
        output_lens=(6,), concurrency=(2,), repeats=1, json=str(out), via_websocket=None, batching=False,
        class_scenario=False, quick=False,
    )  # fmt: skip
    assert bench_dtypes.run_dtypes(args) == 0
    report = json.loads(out.read_text())
    rows = report["routes"]
    assert [rows[r]["decoder"]["name"] for r in rows] == ["transformers", "native"]
    assert rows["float32:native"]["agreement"]["identical_share"] == 1.0
    lone = report["ratios"]["lone_float32:native_over_float32:transformers"]
    batched = report["ratios"]["batched_float32:native_over_float32:transformers"]
    assert (lone["target"], batched["target"]) == (1.25, 1.2)  # the native step's targets, not int4's over float32
    assert "decoder: native (the native step" in capsys.readouterr().out


def test_a_route_names_its_decoder_by_one_of_the_choices():
    assert bench_dtypes.parse_routes("auto:transformers,auto") == ["auto:transformers", "auto"]
    assert bench_dtypes.split_route("auto") == ("auto", "auto")
    with pytest.raises(UserError, match=re.escape("each optionally with :auto|:native|:transformers")) as bad:
        bench_dtypes.parse_routes("auto:fast,auto")
    assert bad.value.field == "dtypes"
    assert bench_dtypes.goals_over("int4", "float32") == (bench_dtypes.LONE_GOAL, bench_dtypes.BATCHED_GOAL)
