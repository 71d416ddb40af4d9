"""Sibling int4 projections in one call (loading/quantize.py's Int4Siblings): q, k, v and gate, up of each
layer share one int4 kernel call a step, bit for bit the separate calls, holding no byte more; a new input
is a new call (never another input's output); prompts still run each layer's own float32 weights."""

from __future__ import annotations

import threading
from contextlib import nullcontext

import pytest
import torch
from numerics import CountCalls
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from model_runner.loading.packed import PackedLinear
from model_runner.loading.quantize import (
    FLOAT_ROWS,
    Int4Linear,
    Int4Siblings,
    group_siblings,
    kernel_step,
    quantize_int4,
    weight_count_and_bytes,
)

INT4_MM = torch.ops.aten._weight_int4pack_mm_for_cpu.default


def three_layers(bias: bool, keep_float: bool = False) -> list[Int4Linear]:
    torch.manual_seed(7)
    return [Int4Linear(torch.randn(out, 64), torch.randn(out) if bias else None, keep_float) for out in (128, 64, 64)]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows", [1, 5])
def test_siblings_give_the_separate_calls_outputs_bit_for_bit(bias, rows):
    separate, grouped = three_layers(bias), three_layers(bias)
    Int4Siblings(grouped)
    x = torch.randn(1, rows, 64)
    with CountCalls(INT4_MM) as counted:
        got = [layer(x) for layer in grouped]
    assert counted.calls == 1
    assert all(torch.equal(g, s(x)) for g, s in zip(got, separate))
    assert grouped[0].siblings._held.input is None  # all three took theirs: the outputs are not held on


def test_a_new_input_is_a_new_call_not_the_last_inputs_output():
    separate, grouped = three_layers(bias=False), three_layers(bias=False)
    Int4Siblings(grouped)
    first, second = torch.randn(1, 2, 64), torch.randn(1, 2, 64)
    grouped[0](first)
    assert torch.equal(grouped[1](second), separate[1](second))
    assert torch.equal(grouped[2](first), separate[2](first))  # back to the first input: computed again


def test_another_thread_never_takes_this_threads_held_outputs():
    """The speculative experiment runs the model on a request's thread beside the engine's worker."""
    grouped = three_layers(bias=False)
    Int4Siblings(grouped)
    x = torch.randn(1, 1, 64)
    grouped[0](x)  # this thread holds the outputs for x, two of them untaken
    seen = {}

    def other_thread():
        with CountCalls(INT4_MM) as counted:  # a dispatch mode counts its own thread's calls
            seen["out"] = grouped[1](x)
        seen["calls"] = counted.calls

    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    assert seen["calls"] == 1  # the other thread computed its own, though the input tensor is the same
    assert torch.equal(seen["out"], three_layers(bias=False)[1](x))
    assert grouped[0].siblings._held.untaken == 2  # and this thread's are as it left them


def test_prompt_rows_still_run_each_layers_own_float_weights():
    """A prompt's rows run each layer's float32 weights as the float32 route runs them (oneDNN's packed copy,
    packed.PackedLinear), bit for bit: the int4 route's prompt is float32's."""
    grouped = three_layers(bias=True, keep_float=True)
    Int4Siblings(grouped)
    torch.manual_seed(7)
    floats = [PackedLinear(torch.randn(out, 64), torch.randn(out)) for out in (128, 64, 64)]  # three_layers' weights
    prompt = torch.randn(1, FLOAT_ROWS, 64)
    for layer, float32 in zip(grouped, floats):
        assert torch.equal(layer(prompt), float32(prompt))


def block_wide_model(siblings: bool) -> nn.Module:
    """A two-layer Llama whose projections are whole packing blocks wide (q 128, k and v 64, gate and up
    256: the test model's are narrower, so they stay apart), on the int4 route with float32 prompts."""
    torch.manual_seed(3)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
    )
    model = LlamaForCausalLM(config).eval()
    quantize_int4(model, keep_float=True, siblings=siblings)
    return model


def logits_and_int4_calls(model: nn.Module, tokens: int, decode: bool) -> tuple[torch.Tensor, int]:
    ids = torch.arange(3, 3 + tokens)[None]
    with torch.inference_mode(), kernel_step() if decode else nullcontext(), CountCalls(INT4_MM) as counted:
        logits = model(input_ids=ids, use_cache=False).logits
    return logits, counted.calls


def test_a_layer_runs_four_int4_calls_instead_of_seven_with_the_same_logits_and_bytes():
    grouped, separate = block_wide_model(siblings=True), block_wide_model(siblings=False)
    for tokens in (1, 5):  # decode rows: the int4 kernel
        (got, calls), (expected, separate_calls) = (logits_and_int4_calls(m, tokens, True) for m in (grouped, separate))
        assert (calls, separate_calls) == (4 * 2, 7 * 2)
        assert torch.equal(got, expected)
    got, calls = logits_and_int4_calls(grouped, FLOAT_ROWS, decode=False)  # a prompt: float32 weights
    assert calls == 0 and torch.equal(got, logits_and_int4_calls(separate, FLOAT_ROWS, decode=False)[0])
    assert weight_count_and_bytes(grouped) == weight_count_and_bytes(separate)


def test_siblings_that_are_not_whole_packing_blocks_stay_apart():
    """48 rows is not whole blocks on AVX-512 (64): joined, the packed rows would mix; they run alone."""
    torch.manual_seed(9)
    attention = nn.Module()
    names = ("q_proj", "k_proj", "v_proj")
    for name, out in zip(names, (96, 48, 48)):
        setattr(attention, name, Int4Linear(torch.randn(out, 64)))
    assert group_siblings(attention) == 0
    assert all(getattr(attention, name).siblings is None for name in names)
