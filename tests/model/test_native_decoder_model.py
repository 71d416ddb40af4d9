"""The native decoder step on the bundled model, per --dtype route (float32, int4, int8), against transformers'
forward over the same paged pool: a request alone gets transformers' logits bit for bit at every step of its
greedy answer (the same shapes), so the same tokens; eight requests prefilled and decoding together, which the
native step attends row by row (their prompts' step within float32's rounding of the packed batch), get
transformers' tokens up to the first near-tie of the route's rounding."""

from __future__ import annotations

import pytest
import torch
from decoder_runs import Run
from numerics import (
    assert_within_rounding,
    decided_margin,
    first_difference,
    route_tolerance,
    top_two_margin,
)

from bench.dtypes import quality_messages, quality_prompts
from model_runner.loading import loader

ROUTES = ("float32", "int4", "int8")
LONE_PROMPTS = 6  # of the 24 quality prompts, one at a time
TOGETHER = 8  # requests decoding together
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
    if route == "float32":  # the prompts' step, each prompt over its own keys, then the first decode step row by row
        assert_within_rounding(n_steps[0], r_steps[0])  # each against the packed batch
        assert_within_rounding(n_steps[1], r_steps[1])
    near_tie = decided_margin(route_tolerance(route))
    for row, (got, want) in enumerate(zip(native, reference)):
        first = first_difference(got, want)
        if first is not None:  # parted only where transformers' own top two were within the route's rounding
            assert float(top_two_margin(r_steps[first][row])) < near_tie, (route, row, first)
