"""The sampling fields the OpenAI API passes to the sampler (model_runner/text/sampler.py): OpenAI's
frequency and presence penalties, CTRL's repetition penalty, logit_bias, min_p and end tokens held back
(min_tokens), each checked against the formula it implements; untouched logits when none applies; and,
through the engine on the fake model, ignore_eos and min_tokens as vLLM's, and seeded choices apart."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from model_runner.protocol.request import SamplingParams, parse_generate
from model_runner.text.sampler import adjust, choose

LOGITS = torch.tensor([2.0, 1.0, 0.5, -1.0, -3.0])


def test_logits_are_untouched_when_nothing_adjusts_them():
    assert adjust(LOGITS, SamplingParams(), prompt_ids=[0, 1], output_ids=[1, 1]) is LOGITS


def test_frequency_and_presence_penalties_follow_openais_formula():
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    out = adjust(LOGITS, params, output_ids=[1, 1, 3])
    counts = torch.tensor([0.0, 2.0, 0.0, 1.0, 0.0])
    assert torch.equal(out, LOGITS - 0.5 * counts - 0.25 * (counts > 0).float())


def test_the_repetition_penalty_shrinks_positive_and_grows_negative_logits_of_seen_tokens():
    out = adjust(LOGITS, SamplingParams(repetition_penalty=2.0), prompt_ids=[0], output_ids=[3])
    assert out.tolist() == [1.0, 1.0, 0.5, -2.0, -3.0]


def test_logit_bias_adds_to_the_named_tokens_and_can_force_a_choice():
    params = SamplingParams(logit_bias=((4, 100.0),))
    assert choose(LOGITS, params, None).token_id == 4
    with pytest.raises(ValueError, match="beyond the vocabulary"):
        adjust(LOGITS, SamplingParams(logit_bias=((9, 1.0),)))


def test_banned_tokens_cannot_be_chosen():
    assert choose(LOGITS, SamplingParams(), None, banned=(0,)).token_id == 1


def test_min_p_keeps_only_tokens_near_the_likeliest():
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=1.0, min_p=0.3, seed=0)
    picks = {choose(LOGITS, params, gen).token_id for _ in range(200)}
    probs = torch.softmax(LOGITS, -1)
    assert picks == {i for i in range(5) if probs[i] >= 0.3 * probs.max()}


def test_the_candidates_asked_come_back():
    assert len(choose(LOGITS, SamplingParams(), None, candidates=3).candidates) == 3
    assert choose(LOGITS, SamplingParams(), None, candidates=0).candidates == []


def answer(engine, **fields):
    params = parse_generate({"messages": [{"role": "user", "content": "Say hello."}], **fields})
    return list(engine.submit(params))[-1]


def test_ignore_eos_runs_past_the_end_token_to_max_tokens(shared_engine):
    engine = shared_engine("fake")
    assert answer(engine, max_new_tokens=200).reason == "eos"
    ended = answer(engine, max_new_tokens=120, ignore_eos=True)
    assert (ended.reason, ended.tokens) == ("max_tokens", 120)


def test_min_tokens_holds_back_the_end_token_and_stop_strings(shared_engine):
    engine = shared_engine("fake")
    natural = answer(engine, max_new_tokens=200)
    ended = answer(engine, max_new_tokens=200, min_new_tokens=natural.tokens + 5)
    assert ended.tokens >= natural.tokens + 5
    stopped = answer(engine, max_new_tokens=200, stop=["fake"], min_new_tokens=40)
    assert "fake" in stopped.text and stopped.reason == "eos"  # "fake" came before token 40: let through
    assert answer(engine, max_new_tokens=200, stop=["fake"]).reason == "stop_string"


def test_min_tokens_may_not_exceed_max_tokens():
    with pytest.raises(Exception, match="may not exceed"):
        parse_generate({"messages": [{"role": "user", "content": "x"}], "max_new_tokens": 4, "min_new_tokens": 5})


def test_seeded_choices_each_reproduce_and_differ_from_each_other(shared_engine):
    from app.openai.fanout import with_seed

    engine = shared_engine("fake")
    params = parse_generate(
        {"messages": [{"role": "user", "content": "Hi"}], "sampling": {"temperature": 1.0, "seed": 7}}
    )
    texts = [list(engine.submit(with_seed(params, i)))[-1].text for i in range(3)]
    again = [list(engine.submit(with_seed(params, i)))[-1].text for i in range(3)]
    assert texts == again and len(set(texts)) == 3
    assert dataclasses.replace(params).sampling.seed == 7
