"""scripts/prompt_step_probe.py: the packed mode never attends a step's rows apart and the other mode does as the
native step decides, the engine's rule is put back after each, and the report's medians, ratio and agreement
follow from the rounds it timed."""

from __future__ import annotations

import statistics

import pytest

from model_runner.loading.loader import load
from model_runner.local.engine import Engine, EngineConfig
from model_runner.local.model import native
from model_runner.local.model.native import NativeLlama
from model_runner.local.model.paged_step import rows_apart_pay
from scripts import prompt_step_probe

PROMPT_TOKENS = 120  # three prompts of the fake model this long save the rule's pairs a row


@pytest.fixture
def engine():
    return Engine(EngineConfig(model="fake", decoder="native"), loaded=load("fake"))


def bodies(engine, clients: int = 3) -> list[dict]:
    from bench.measure import fit_prompt

    prompts = [fit_prompt(engine.describe_prompt, PROMPT_TOKENS, variant=i) for i in range(clients)]
    return [{"messages": p.messages, "max_new_tokens": 1} for p in prompts]


def test_the_packed_mode_never_attends_apart_and_the_apart_mode_does(engine, monkeypatch):
    apart_calls = []  # each layer's row-by-row attention
    attend_rows = NativeLlama._attend_rows
    monkeypatch.setattr(NativeLlama, "_attend_rows", lambda *a: apart_calls.append(1) or attend_rows(*a))
    requests = bodies(engine)
    _, steps, packed_firsts = prompt_step_probe.prompts_step(engine, requests, "packed")
    assert apart_calls == [] and native.rows_apart_pay is rows_apart_pay  # the engine's rule is back
    _, _, apart_firsts = prompt_step_probe.prompts_step(engine, requests, "apart")
    assert len(apart_calls) == 2 * steps and native.rows_apart_pay is rows_apart_pay  # both layers, every step
    assert packed_firsts == apart_firsts and -1 not in apart_firsts  # each request got its first token


def test_the_report_follows_from_its_rounds(engine):
    report = prompt_step_probe.probe(engine, clients=3, prompt_tokens=PROMPT_TOKENS, rounds=3)
    times = report["ms_per_round"]
    assert len(times["packed"]) == len(times["apart"]) == 3
    packed, apart = statistics.median(times["packed"]), statistics.median(times["apart"])
    assert report["median_ms"] == {"packed": round(packed, 2), "apart": round(apart, 2)}
    assert report["apart_over_packed"] == round(apart / packed, 3)
    assert report["apart_faster_rounds"] == sum(a < p for a, p in zip(times["apart"], times["packed"]))
    assert report["same_first_tokens"] is True and report["steps"] == {"packed": [1], "apart": [1]}
    assert all(t <= PROMPT_TOKENS for t in report["prompt_tokens"]) and len(report["prompt_tokens"]) == 3
