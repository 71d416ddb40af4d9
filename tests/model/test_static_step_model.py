"""The padded decode step that CUDA graphs replay (core/static_step.py), on the product's model in float32
on the CPU: four requests decoding together get the same greedy tokens and the same KV figures as on the
eager step, and their decode steps really ran padded (4 rows, keys to a power of two)."""

from __future__ import annotations

import sys
from pathlib import Path

from kvscope_testkit import ask

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


def test_the_padded_decode_step_gives_the_eager_steps_tokens_on_the_real_model(real_engine_float32, engine_factory):
    padded_engine = engine_factory("default", dtype="float32", cuda_graphs="padded")
    eager = run_together(real_engine_float32, "eager")
    steps_before = padded_engine.snapshot()["decode"]["static_steps"]
    padded = run_together(padded_engine, "padded")
    assert all(events[-1]["type"] == "finished" for events in eager + padded)
    assert [figures(e) for e in padded] == [figures(e) for e in eager]
    assert max(f[1] for events in padded for f in figures(events)) == 4  # they shared steps
    assert padded_engine.snapshot()["decode"]["static_steps"] - steps_before >= max(MAX_NEW) - 1
