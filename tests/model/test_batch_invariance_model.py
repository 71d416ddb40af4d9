"""Batch-invariant decoding on the bundled model (model_runner/local/step/invariant.py): 16 greedy requests sent
together get their 16 lone answers, every step's logits the same bits, on the default route (int4 kernels,
float32 prompts, the int8 head rescored in float32) and on float32; the start-up kernel check claims the
mode on this CPU. Run once with AVX2 kernels forced as well (ATEN_CPU_CAPABILITY=avx2
MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2): docs/reliability.md gives both results."""

from __future__ import annotations

import pytest
import torch
from kvscope_testkit import Recorder, ask, events_of, start_engine, stop_engine

from model_runner.shared.policy import Policy

QUESTIONS = [
    "Name three primary colours.",
    "What is the capital of France?",
    "Write a haiku about rain.",
    "Explain photosynthesis in one sentence.",
    "List two uses of a paperclip.",
    "What is 12 times 7?",
    "Describe a cat in five words.",
    "Why is the sky blue?",
    "Give me a synonym for happy.",
    "What does a CPU do?",
    "Translate 'good morning' to Spanish.",
    "Name a planet with rings.",
    "What is the boiling point of water?",
    "Suggest a name for a dog.",
    "What is gravity?",
    "Tell me a fun fact about octopuses.",
]
TOKENS = 24
TIMEOUT_S = 900.0  # the shared 2-core machine: sixteen padded requests can take minutes


def answers(engine, questions: list[str]) -> list[list[dict]]:
    with engine.admissions_held():
        handles = [
            engine.submit(ask(q, max_new_tokens=TOKENS, ignore_eos=True), request_id=f"q{i}")
            for i, q in enumerate(questions)
        ]
    return [events_of(h, TIMEOUT_S) for h in handles]


def token_ids(events: list[dict]) -> list[int]:
    assert events[-1]["type"] == "finished", events[-1]
    return [e["id"] for e in events if e["type"] == "token"]


@pytest.fixture(scope="module", params=["auto", "float32"], ids=["default-route", "float32"])
def invariant_engine(request):
    engine = start_engine("default", dtype=request.param, policy=Policy(batch_invariant=True), timeout_s=TIMEOUT_S)
    yield engine, Recorder(engine)
    stop_engine(engine)


def test_sixteen_greedy_requests_sent_together_get_their_sixteen_lone_answers_bit_for_bit(invariant_engine):
    engine, seen = invariant_engine
    assert engine.batch_invariance()["claimed"] is True, engine.batch_invariance()
    lone = {}
    for i, question in enumerate(QUESTIONS):
        tokens = token_ids(answers(engine, [question])[0])
        lone[i] = (tokens, seen.rows.pop("q0"))
    together = answers(engine, QUESTIONS)
    same_tokens = [i for i, events in enumerate(together) if token_ids(events) == lone[i][0]]
    same_bits = [
        i
        for i in range(len(QUESTIONS))
        if len(seen.rows[f"q{i}"]) == len(lone[i][1]) and all(map(torch.equal, seen.rows[f"q{i}"], lone[i][1]))
    ]
    assert same_tokens == list(range(16)), f"batched answers equal to the lone ones: {same_tokens}"
    assert same_bits == list(range(16)), f"batched logits equal to the lone ones bit for bit: {same_bits}"
