"""scripts/compile_probe.py: the stretches it compiles are the native step's own, traced once for every layer (a
layer's weights are arguments, not constants), and a step on them is the eager step's bits when the compiler
keeps the ops (dynamo's eager backend: the probe's own tracing, without inductor's C++ compile)."""

from __future__ import annotations

import pytest
import torch
from decoder_runs import Run, int4_llama
from torch._dynamo.utils import counters

from model_runner.local.model import native
from scripts import compile_probe


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
    counters.clear()


def test_the_stretches_are_traced_once_for_every_layer_and_keep_the_eager_bits(fresh_dynamo):
    model = int4_llama()
    eager, traced = Run(model, "native"), Run(model, "native")
    compile_probe.use(traced.forward.decoder, compile_probe.compiled({}, backend="eager"))
    prompts = [("a", list(range(5, 12))), ("b", list(range(20, 30)))]
    for run in (eager, traced):
        run.step(prompts)
    for step in range(3):
        decode = [("a", [40 + step]), ("b", [50 + step])]
        assert torch.equal(traced.step(decode), eager.step(decode)), step
    for key in "ab":
        assert torch.equal(traced.kv(key), eager.kv(key))
    assert counters["stats"]["unique_graphs"] == 2  # before_attention and after_attention, for both layers


def test_the_native_step_runs_the_stretches_it_holds():
    run = Run(int4_llama(), "native")
    decoder, calls = run.forward.decoder, []
    assert decoder.stretches == (native.before_attention, native.after_attention)

    def counted(fn):
        return lambda *args: calls.append(fn.__name__) or fn(*args)

    compile_probe.use(decoder, (counted(native.before_attention), counted(native.after_attention)))
    run.step([("a", list(range(5, 12)))])
    assert not calls  # a prompt's step runs the modules
    run.step([("a", [40])])
    assert calls == ["before_attention", "after_attention"] * 2  # each of the two layers, in order
