"""scripts/profile_step.py: the steps it times are the decode steps (every request stepped together past its
prompt and still running, so each makes a token), the other steps apart, and its profile averages over the
steps it profiled: every step, or with --decode-only the decode steps alone."""

from __future__ import annotations

import pytest

from model_runner.loading.loader import load
from model_runner.local.engine import Engine, EngineConfig
from scripts import profile_step


@pytest.fixture
def engine():
    return Engine(EngineConfig(model="fake"), loaded=load("fake"))


def counting_steps(engine, monkeypatch) -> list:
    steps = []
    step = engine.step
    monkeypatch.setattr(engine, "step", lambda: steps.append(1) or step())
    return steps


def test_a_lone_request_s_decode_steps_are_every_step_after_its_prompt_s(engine):
    forwards, others, phases = [], [], []
    times = profile_step.decode_steps(engine, 6, forwards, 1, others, on_phase=phases.append)
    assert len(times) == 5 and len(others) == 1  # the prompt's step makes the first of 6 tokens
    assert phases == ["decode", "end"] and len(forwards) == 5 and all(ms > 0 for ms in forwards)


def test_with_several_clients_the_decode_steps_are_those_every_request_makes_a_token_in(engine, monkeypatch):
    steps, phases, others, forwards = counting_steps(engine, monkeypatch), [], [], []
    times = profile_step.decode_steps(engine, 6, forwards, 3, others, on_phase=phases.append)
    assert phases == ["decode", "end"] and len(times) + len(others) == len(steps)
    assert 1 <= len(times) <= 5  # the first token of each comes from its prompt's step
    assert len(forwards) == len(times)  # the first request makes a token in every decode step


@pytest.mark.parametrize("decode_only", [False, True])
def test_the_profile_averages_over_the_steps_it_profiled(engine, decode_only):
    result = profile_step.profile(engine, 5, top=5, clients=2, decode_only=decode_only)
    decode, others = result["profiled_decode_steps"], result["profiled_other_steps"]
    assert decode >= 1 and (others == 0) == decode_only and len(result["ops"]) == 5
    profiled = decode + others
    for op in result["ops"]:  # each op's calls a step times the steps profiled: a whole number of calls
        assert op["calls_per_step"] * profiled == pytest.approx(
            round(op["calls_per_step"] * profiled), abs=0.06 * profiled
        )
