"""What a structured-output mask costs per step on the bundled model (docs/protocol.md, "What the mask
is, and what it costs"): xgrammar's compiler built for the tokenizer (once per server), one schema
compiled, then over a JSON-schema answer each step's bitmask fill alone and the whole mask step (fill,
count the allowed tokens, apply to the logits) timed; beside them the engine's decode step_ms, free and
under a JSON-object constraint, batch 1, greedy. Measured, on whatever machine runs it; prints the load.

Run: `.venv/bin/python scripts/measure_mask_cost.py`."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from model_runner.local.engine import Engine, EngineConfig  # noqa: E402
from model_runner.protocol.constraint import Constraint  # noqa: E402
from model_runner.protocol.request import parse_generate  # noqa: E402
from model_runner.shared.constraints import Guide, compiled  # noqa: E402

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}
PROMPT = "Describe a cat as JSON with its name and age."


def timed_ms(fn) -> tuple[object, float]:
    start = time.perf_counter()
    value = fn()
    return value, (time.perf_counter() - start) * 1000


def mask_steps(tokenizer, vocab: int) -> tuple[list[float], list[float]]:
    """(fill ms, whole mask step ms) per step of a schema answer drawn greedily from random logits."""
    grammar = compiled(
        Constraint("json_schema", json.dumps(SCHEMA | {"required": ["name", "age"]}), "f"), tokenizer, vocab
    )
    guide, fills, steps = Guide(grammar, vocab), [], []
    for _ in range(40):
        logits = torch.randn(vocab)
        fills.append(timed_ms(lambda: guide.matcher.fill_next_token_bitmask(guide.bitmask))[1])
        steps.append(timed_ms(lambda: guide.apply(logits))[1])
        token = int(torch.argmax(logits))
        guide.accept(token)
        if token in tokenizer.eos_ids:
            break
    return fills, steps


def decode_step_ms(engine, constraint) -> list[float]:
    fields = {"messages": [{"role": "user", "content": PROMPT}], "max_new_tokens": 40, "sampling": {"temperature": 0}}
    params = dataclasses.replace(parse_generate(fields), constraint=constraint)
    events = [e.to_dict() for e in engine.submit(params, "mask-cost", label="measure")]
    return [e["step_ms"] for e in events if e["type"] == "token" and e["index"] > 0]


def main() -> None:
    torch.set_num_threads(1)
    engine = Engine(EngineConfig(model="default")).start()
    engine.wait_ready(600)
    tokenizer, vocab = engine.local.loaded.tokenizer, engine.facts.vocab_size
    _, first = timed_ms(lambda: compiled(Constraint("json_object", "", "f"), tokenizer, vocab))
    _, schema = timed_ms(lambda: compiled(Constraint("json_schema", json.dumps(SCHEMA), "f"), tokenizer, vocab))
    print(f"compiler for the tokenizer and a first grammar: {first:.0f} ms; a schema after that: {schema:.2f} ms")
    fills, steps = mask_steps(tokenizer, vocab)
    print(f"bitmask fill: median {statistics.median(fills):.3f} ms; whole mask step: median "
          f"{statistics.median(steps):.3f} ms ({len(steps)} steps)")  # fmt: skip
    for run in range(2):
        free, masked = decode_step_ms(engine, None), decode_step_ms(engine, Constraint("json_object", "", "f"))
        print(f"run {run}: decode step_ms median free {statistics.median(free):.1f} ({len(free)} steps), "
              f"json_object {statistics.median(masked):.1f} ({len(masked)} steps)")  # fmt: skip
    print(f"load average (1, 5, 15 min): {os.getloadavg()}")
    engine.shutdown()


if __name__ == "__main__":
    main()
