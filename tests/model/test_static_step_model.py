"""The padded decode step that CUDA graphs replay (local/step/static_step.py), on the product's model in float32
on the CPU: four requests decoding together get the eager step's greedy tokens up to a near-tie (padded keys
and rows round the sums otherwise), and with them the same KV figures, and their decode steps really ran
padded (4 rows, keys to a power of two)."""

from __future__ import annotations

import sys
from pathlib import Path

from kvscope_testkit import ask
from numerics import decided_margin, event_margin, first_difference, route_tolerance

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts/ is importable from the checkout's root
from scripts.gpu_check import together  # noqa: E402 (the GPU check's own way of running requests together)

QUESTIONS = ["What does a KV cache store?", "Name three colours.", "Say hello.", "What is a token?"]
MAX_NEW = [16, 8, 6, 12]  # requests leave at different steps: the bucket shrinks from 4 rows to 2 and 1


def run_together(engine, label: str) -> list[list[dict]]:
    return together(engine, [ask(q, max_new_tokens=n) for q, n in zip(QUESTIONS, MAX_NEW)], label, timeout_s=300)


def figures(events: list[dict]) -> list[tuple]:
    return [
        (e["id"], e["batch_size"], e["cache_tokens"], e["cache_bytes_measured"], e["kv_blocks"])
        for e in events
        if e["type"] == "token"
    ]


def same_up_to_a_near_tie(got: list[dict], want: list[dict], near_tie: float) -> bool:
    """got's tokens and figures are want's up to the first token where want's top two were within `near_tie`."""
    got_figures, want_figures = figures(got), figures(want)
    first = first_difference([f[0] for f in got_figures], [f[0] for f in want_figures])
    if first is None:
        return got_figures == want_figures
    tokens = [e for e in want if e["type"] == "token"]
    return got_figures[:first] == want_figures[:first] and event_margin(tokens[first]) < near_tie


def test_the_padded_decode_step_gives_the_eager_steps_tokens_on_the_real_model(real_engine_float32, engine_factory):
    padded_engine = engine_factory("default", dtype="float32", cuda_graphs="padded")
    eager = run_together(real_engine_float32, "eager")
    steps_before = padded_engine.snapshot()["decode"]["static_steps"]
    padded = run_together(padded_engine, "padded")
    assert all(events[-1]["type"] == "finished" for events in eager + padded)
    near_tie = decided_margin(route_tolerance("float32"))
    assert all(same_up_to_a_near_tie(p, e, near_tie) for p, e in zip(padded, eager)), (padded, eager)
    assert max(f[1] for events in padded for f in figures(events)) == 4  # they shared steps
    assert padded_engine.snapshot()["decode"]["static_steps"] - steps_before >= max(MAX_NEW) - 1
