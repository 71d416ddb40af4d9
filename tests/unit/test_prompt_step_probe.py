"""scripts/prompt_step_probe.py: its packed mode never attends a step's rows apart and its apart mode always does,
whatever the engine's rule says (which it records), the engine's rule is put back after each run, and the report
sets each mode's rounds under its own name, interleaved, with medians, ratio and agreement that follow from them."""

from __future__ import annotations

import statistics

import pytest

from model_runner.loading.loader import load
from model_runner.local.engine import Engine, EngineConfig
from model_runner.local.model import native
from model_runner.local.model.native import NativeLlama
from model_runner.local.model.paged_step import rows_apart_pay
from scripts import prompt_step_probe

LAYERS = 2  # the fake model's


@pytest.fixture
def engine():
    return Engine(EngineConfig(model="fake", decoder="native"), loaded=load("fake"))


def bodies(engine, tokens: int, clients: int = 3) -> list[dict]:
    from bench.measure import fit_prompt

    prompts = [fit_prompt(engine.describe_prompt, tokens, variant=i) for i in range(clients)]
    return [{"messages": p.messages, "max_new_tokens": 1} for p in prompts]


@pytest.mark.parametrize(("tokens", "rule"), [(120, True), (30, False)])  # the rule sends apart, keeps packed
def test_packed_never_attends_apart_and_apart_always_does_whatever_the_rule_says(engine, monkeypatch, tokens, rule):
    apart_calls = []  # each layer's row-by-row attention
    attend_rows = NativeLlama._attend_rows
    monkeypatch.setattr(NativeLlama, "_attend_rows", lambda *a: apart_calls.append(1) or attend_rows(*a))
    requests = bodies(engine, tokens)
    _, chosen, packed_firsts = prompt_step_probe.prompts_step(engine, requests, "packed")
    assert apart_calls == [] and chosen == [rule] and native.rows_apart_pay is rows_apart_pay
    _, chosen, apart_firsts = prompt_step_probe.prompts_step(engine, requests, "apart")
    assert len(apart_calls) == LAYERS and chosen == [rule] and native.rows_apart_pay is rows_apart_pay
    assert packed_firsts == apart_firsts


def test_the_engine_s_rule_is_put_back_when_a_step_fails(engine, monkeypatch):
    monkeypatch.setattr(engine, "step", lambda: (_ for _ in ()).throw(RuntimeError("a failing step")))
    with pytest.raises(RuntimeError, match="a failing step"):
        prompt_step_probe.prompts_step(engine, bodies(engine, 30), "apart")
    assert native.rows_apart_pay is rows_apart_pay


def test_a_step_with_nothing_to_do_before_every_first_token_is_an_error(engine, monkeypatch):
    monkeypatch.setattr(engine, "step", lambda: False)
    with pytest.raises(RuntimeError, match="nothing to step"):
        prompt_step_probe.prompts_step(engine, bodies(engine, 30), "packed")
    assert native.rows_apart_pay is rows_apart_pay


def test_the_rounds_alternate_and_each_mode_s_times_are_its_own(engine, monkeypatch):
    calls = []  # the modes in the order the probe ran them
    times = {"packed": iter([1000.0, 10.0, 30.0, 20.0]), "apart": iter([1000.0, 4.0, 6.0, 5.0])}

    def fake_step(_engine, _bodies, mode):
        calls.append(mode)
        return next(times[mode]), [True], [7, 8]

    monkeypatch.setattr(prompt_step_probe, "prompts_step", fake_step)
    report = prompt_step_probe.probe(engine, clients=2, prompt_tokens=30, rounds=3)
    assert calls == ["packed", "apart"] + ["packed", "apart", "apart", "packed", "packed", "apart"]  # warm, then 3
    assert report["ms_per_round"] == {"packed": [10.0, 30.0, 20.0], "apart": [4.0, 6.0, 5.0]}  # warm-up dropped
    assert report["median_ms"] == {"packed": 20.0, "apart": 5.0} and report["apart_over_packed"] == 0.25
    assert report["apart_faster_rounds"] == 3 and report["same_first_tokens"] is True
    assert report["steps"] == {"packed": [1], "apart": [1]} and report["rule_apart"] == [[True]]
    assert statistics.median(report["ms_per_round"]["packed"]) == report["median_ms"]["packed"]
