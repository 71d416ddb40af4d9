"""The native decoder step on the bundled model, per --dtype route (float32, int4, int8), against transformers'
forward over the same paged pool: a request alone gets transformers' logits bit for bit at every step of its
greedy answer (the same shapes), so the same tokens; eight requests prefilled together (short prompts, which
the native step keeps packed: the same bits) and decoding together, which it attends row by row, get
transformers' tokens up to the first near-tie of the route's rounding; longer prompts it attends apart get the
packed batch's logits within rounding (float32; on int4 and int8, whose head scores in float32 only its first
pass's 32 highest, the tokens the packed batch decides beyond the route's rounding)."""

from __future__ import annotations

import pytest
import torch
from decoder_runs import Run, step_shape
from numerics import (
    assert_within_rounding,
    decided_margin,
    first_difference,
    route_tolerance,
    top_two_margin,
)

from bench.dtypes import quality_messages, quality_prompts
from model_runner.loading import loader
from model_runner.local.model.native import NativeLlama
from model_runner.local.model.paged_step import rows_apart_pay

ROUTES = ("float32", "int4", "int8")
LONE_PROMPTS = 6  # of the 24 quality prompts, one at a time
TOGETHER = 8  # requests decoding together
APART_TOKENS = 96  # 4 prompts this long: 27,648 pairs saved a row, which the rule sends apart
NEW_TOKENS = 16


@pytest.fixture(scope="module", params=ROUTES)
def loaded(request):
    return loader.load("default", "cpu", request.param)


def prompt_ids(loaded, count: int) -> list[list[int]]:
    tokenizer = loaded.tokenizer
    return [tokenizer.encode(tokenizer.render_chat(m))[0] for m in quality_messages(quality_prompts())[:count]]


def greedy(run: Run, prompts: list[list[int]], new_tokens: int) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Prompts prefilled together, then greedy decode steps together → (each row's tokens, each step's logits)."""
    keys = [f"r{i}" for i in range(len(prompts))]
    logits = run.step(list(zip(keys, prompts)))
    steps, tokens = [logits], [[t] for t in logits.argmax(-1).tolist()]
    for _ in range(new_tokens - 1):
        logits = run.step([(key, [row[-1]]) for key, row in zip(keys, tokens)])
        steps.append(logits)
        for row, token in zip(tokens, logits.argmax(-1).tolist()):
            row.append(token)
    return tokens, steps


def test_a_lone_answer_is_transformers_logits_bit_for_bit(loaded):
    for ids in prompt_ids(loaded, LONE_PROMPTS):
        native = greedy(Run(loaded.model, "native", blocks=8), [ids], NEW_TOKENS)
        reference = greedy(Run(loaded.model, "transformers", blocks=8), [ids], NEW_TOKENS)
        assert native[0] == reference[0]
        assert all(torch.equal(a, b) for a, b in zip(native[1], reference[1]))


def test_answers_decoded_together_are_transformers_tokens_up_to_a_near_tie(loaded):
    route = loaded.facts.dtype_route
    prompts = prompt_ids(loaded, TOGETHER)
    native, n_steps = greedy(Run(loaded.model, "native", blocks=64), prompts, NEW_TOKENS)
    reference, r_steps = greedy(Run(loaded.model, "transformers", blocks=64), prompts, NEW_TOKENS)
    assert not rows_apart_pay(step_shape([(len(p), len(p)) for p in prompts]))  # short prompts: kept packed
    assert torch.equal(n_steps[0], r_steps[0])  # the prompts' step: the same packed shapes
    if route == "float32":
        assert_within_rounding(n_steps[1], r_steps[1])  # the first decode step, row by row vs packed
    near_tie = decided_margin(route_tolerance(route))
    for row, (got, want) in enumerate(zip(native, reference)):
        first = first_difference(got, want)
        if first is not None:  # parted only where transformers' own top two were within the route's rounding
            assert float(top_two_margin(r_steps[first][row])) < near_tie, (route, row, first)


def test_prompts_attended_apart_get_the_packed_batch_s_logits_within_rounding(loaded, monkeypatch):
    route = loaded.facts.dtype_route
    prompts = [(ids * 4)[:APART_TOKENS] for ids in prompt_ids(loaded, 4)]  # each quality prompt repeated
    assert rows_apart_pay(step_shape([(len(p), len(p)) for p in prompts]))
    apart = []  # the native step's row-by-row attention, once a layer
    attend_rows = NativeLlama._attend_rows
    monkeypatch.setattr(NativeLlama, "_attend_rows", lambda *a: apart.append(1) or attend_rows(*a))
    keys = [f"r{i}" for i in range(len(prompts))]
    got = Run(loaded.model, "native", blocks=64).step(list(zip(keys, prompts)))
    want = Run(loaded.model, "transformers", blocks=64).step(list(zip(keys, prompts)))
    assert len(apart) == loaded.model.config.num_hidden_layers
    if route == "float32":
        assert_within_rounding(got, want)
    else:  # the int4 and int8 heads score in float32 only their first pass's 32 highest: the choice is compared
        decided = top_two_margin(want) > decided_margin(route_tolerance(route))
        assert decided.any() and torch.equal(got.argmax(-1)[decided], want.argmax(-1)[decided])
