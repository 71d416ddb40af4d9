"""Speculative decoding on the product's model (SmolLM2-135M-Instruct, CPU): with prompt-lookup
proposals verified in one forward each, the greedy output is token for token what plain greedy
decoding gives (the bench's bare loop, an independent implementation), and every produced token is
either an accepted proposal or the model's own bonus token. A (k+1)-token verifying forward sums in another
order than a one-token step, so the two may part only at a near-tie: where the model's own top two are within
float32's rounding (tests/numerics.py). In float32: see `loaded` for why."""

from __future__ import annotations

import pytest
import torch
from kvscope_testkit import ask
from numerics import decided_margin, first_difference, route_tolerance, top_two_margin

from bench.baselines import bare_greedy_loop
from model_runner.text.prompt import plan
from serving_experiments.prompts import PASSAGE
from serving_experiments.speculative import PromptLookup, speculative_greedy

MAX_NEW = 24
PROMPTS = {
    "rewrite": f"Rewrite this passage, keeping every sentence but replacing 'token' with 'word':\n\n{PASSAGE}",
    "repeat": f"Repeat this passage word for word:\n\n{PASSAGE}",
    "open": "Tell me a short story about a lighthouse keeper.",
    "list": "List the days of the week, one per line.",
}


@pytest.fixture(scope="module")
def loaded(shared_engine):
    """The model in float32. On the int8 route (`--dtype auto` on an AVX CPU) the linear layers take
    bfloat16 activations, so logits come in steps of 1/16 around 15: near-ties are common, and a
    (k+1)-token forward rounds them differently from a 1-token forward, which can flip a tie — a
    property of that arithmetic, not of speculation, so the equality is checked in float32."""
    return shared_engine("default", dtype="float32").loaded


def ids_of(loaded, prompt: str) -> list[int]:
    return plan(loaded.tokenizer, ask(prompt, max_new_tokens=MAX_NEW), loaded.facts.context_window).ids


def answer_margins(model, ids: list[int], answer: list[int]) -> torch.Tensor:
    """[answer]: the top-two gap of the logits that chose each answer token, from one forward over the prompt
    and the answer (a third shape: where two runs at other shapes part, its gap is within twice the rounding)."""
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids + answer[:-1]]), use_cache=False).logits  # [1, seq, vocab]
    return top_two_margin(logits[0, len(ids) - 1 :])


@pytest.mark.parametrize("kind", list(PROMPTS))
def test_speculative_output_is_plain_greedy_output(loaded, kind):
    ids = ids_of(loaded, PROMPTS[kind])
    eos = loaded.tokenizer.eos_ids
    plain = bare_greedy_loop(loaded.model, ids, MAX_NEW, eos)
    spec = speculative_greedy(loaded.model, ids, MAX_NEW, eos, PromptLookup(), k=4)
    first = first_difference(spec.token_ids, plain.token_ids)
    if first is not None:  # parted: only where float32's own top two are within its rounding
        assert first < len(plain.token_ids), (kind, first)
        gap = float(answer_margins(loaded.model, ids, plain.token_ids)[first])
        assert gap <= decided_margin(route_tolerance("float32")), (kind, first, gap)
    assert sum(s.accepted for s in spec.steps) + sum(s.bonus is not None for s in spec.steps) == len(spec.token_ids)
    assert all(s.accepted + s.rejected == len(s.proposed) for s in spec.steps)


def test_copying_a_passage_accepts_proposals(loaded):
    """Where the answer repeats the prompt, lookup proposals are right and whole steps are saved."""
    ids = ids_of(loaded, PROMPTS["repeat"])
    spec = speculative_greedy(loaded.model, ids, MAX_NEW, loaded.tokenizer.eos_ids, PromptLookup(), k=4)
    assert spec.accepted > 0
    assert len(spec.steps) < len(spec.token_ids)
