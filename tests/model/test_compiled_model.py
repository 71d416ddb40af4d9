"""The bundled model on the default (int4) route with its decode stretches compiled ahead of time (`--compile
on`, model_runner/local/model/compiled.py): the same steps as the eager native step, so the same logits bit for
bit, a request alone and eight decoding together (the same shapes on both sides), under the suite's one thread
count and this CPU's kernels (the library is compiled for them: its cache key names torch's capability)."""

from __future__ import annotations

import os

import pytest
import torch
from decoder_runs import Run
from test_native_decoder_model import greedy, prompt_ids

from model_runner.loading import loader
from model_runner.local.model import compiled

NEW_TOKENS = 12
os.environ["AOTI_RUNTIME_CHECK_INPUTS"] = "1"  # the libraries check the step's real inputs against the export's


@pytest.fixture(scope="module")
def library():
    """The bundled int4 model and its decode stretches compiled (or loaded from the cache) and switched in."""
    loaded = loader.load("default", "cpu", "int4")
    decoder = Run(loaded.model, "native", blocks=8).forward.decoder
    status = compiled.start(decoder, "on", torch.device("cpu")).wait()
    assert status.state == "on", status.reason
    return loaded, decoder.stretches


@pytest.mark.parametrize("together", [1, 8, 16])
def test_the_compiled_stretches_give_the_eager_steps_logits_bit_for_bit(library, together):
    loaded, stretches = library
    eager, fast = Run(loaded.model, "native", blocks=64), Run(loaded.model, "native", blocks=64)
    fast.forward.decoder.stretches = stretches
    assert stretches != eager.forward.decoder.stretches
    prompts = prompt_ids(loaded, together)
    tokens, steps = greedy(fast, prompts, NEW_TOKENS)
    reference, reference_steps = greedy(eager, prompts, NEW_TOKENS)
    assert tokens == reference
    assert all(torch.equal(a, b) for a, b in zip(steps, reference_steps))
