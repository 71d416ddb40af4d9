"""scripts/profile_step.py: the steps it times are the decode steps (every request stepped together past its
prompt and still running, so each makes a token), the other steps apart, and its profile averages over the
steps it profiled: every step, or with --decode-only the decode steps alone."""

from __future__ import annotations

import pytest
import torch

from model_runner.loading.loader import load
from model_runner.local.engine import Engine, EngineConfig
from scripts import profile_step

MARK = "kvscope-test-step"  # a profiler range around each engine step


@pytest.fixture
def engine():
    return Engine(EngineConfig(model="fake"), loaded=load("fake"))


def marked_steps(engine, monkeypatch) -> list[int]:
    """Wrap each engine step in a profiler range; → the steps' count so far, one entry a step."""
    steps: list[int] = []
    step = engine.step

    def marked():
        steps.append(len(steps) + 1)
        with torch.profiler.record_function(MARK):
            return step()

    monkeypatch.setattr(engine, "step", marked)
    return steps


def test_a_lone_request_s_decode_steps_are_every_step_after_its_prompt_s(engine):
    forwards, others, phases = [], [], []
    times = profile_step.decode_steps(engine, 6, forwards, 1, others, on_phase=phases.append)
    assert len(times) == 5 and len(others) == 1  # the prompt's step makes the first of 6 tokens
    assert phases == ["decode", "end"] and len(forwards) == 5 and all(ms > 0 for ms in forwards)


def test_with_several_clients_the_steps_before_all_start_and_after_one_ends_are_not_decode_steps(engine, monkeypatch):
    steps, at = marked_steps(engine, monkeypatch), []
    others, forwards = [], []
    times = profile_step.decode_steps(engine, 6, forwards, 3, others, on_phase=lambda p: at.append((p, len(steps))))
    # the fake engine takes a new request's prompt a step: 3 prompt steps, 3 steps of all three, then the two
    # later requests' last tokens alone
    assert (len(times), len(others), len(steps)) == (3, 5, 8)
    assert at == [("decode", 3), ("end", 6)]  # the phases change between steps, once each
    assert len(forwards) == 3


@pytest.mark.parametrize("decode_only", [False, True])
def test_the_profile_averages_over_exactly_the_steps_it_profiled(engine, monkeypatch, decode_only):
    steps = marked_steps(engine, monkeypatch)
    result = profile_step.profile(engine, 6, top=1000, clients=3, decode_only=decode_only)
    decode, others = result["profiled_decode_steps"], result["profiled_other_steps"]
    assert (decode, others) == (3, 0 if decode_only else 5) and len(steps) == 8
    mark = next(op for op in result["ops"] if op["op"] == MARK)
    assert mark["calls_per_step"] == 1.0  # one range a profiled step: none outside the profile's steps


def test_a_run_with_no_decode_step_says_so(engine):
    with pytest.raises(SystemExit, match="no decode step"):
        profile_step.decode_steps(engine, 1)
