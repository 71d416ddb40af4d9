"""What attention inspection costs a decode step, measured A/B/C interleaved in one run on the engine:
transformers' own sdpa (the path before inspection existed), kvscope's sdpa without inspection (what
every request now runs), and with `inspect.attention` on. Prints JSON: median decode step per arm,
its ratio to plain sdpa (pooled, and the median of each round's ratio), the attention event's size, the load average before and after.

    .venv/bin/python scripts/attention_cost.py [--rounds 6] [--tokens 32] [--dtype auto]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics

import torch

from model_runner.local.engine import Engine, EngineConfig
from model_runner.local.model.attention_inspect import IMPLEMENTATION
from model_runner.protocol.request import parse_generate
from model_runner.text.prompt import plan

ARMS = ("sdpa", "kvscope", "inspect")
PROMPT = "Explain, step by step, how a library lends books and what happens when one is late. " * 12


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def request_fields(tokens: int) -> dict:
    return {"messages": [{"role": "user", "content": PROMPT}], "max_new_tokens": tokens, "stop": []}


def one_request(engine: Engine, arm: str, tokens: int) -> tuple[list[float], list[int], list[int]]:
    """Decode step times (ms, the first token's prefill left out), attention event sizes (bytes), token ids."""
    engine.loaded.model.set_attn_implementation("sdpa" if arm == "sdpa" else IMPLEMENTATION)  # the engine is idle
    fields = request_fields(tokens)
    if arm == "inspect":
        fields["inspect"] = {"attention": True}
    steps, sizes, ids = [], [], []
    for event in engine.submit(parse_generate(fields), arm):
        if event.type == "token":
            ids.append(event.id)
        if event.type == "token" and event.index > 0:
            steps.append(event.step_ms)
        elif event.type == "attention":
            sizes.append(len(event.to_json().encode()))
    return steps, sizes, ids


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args()
    # transformers' decoder: its arms switch the model's attention implementation, which the native step never reads
    engine = Engine(EngineConfig(model="default", dtype=args.dtype, decoder="transformers")).start()
    engine.wait_ready(600)
    one_request(engine, "inspect", 4)  # warm-up, not counted
    before = load()
    steps: dict[str, list[float]] = {arm: [] for arm in ARMS}
    paired: dict[str, list[float]] = {arm: [] for arm in ARMS}  # per round: this arm's median ÷ sdpa's
    sizes: list[int] = []
    answers: set[tuple[int, ...]] = set()
    for r in range(args.rounds):
        medians = {}
        for arm in ARMS[r % 3 :] + ARMS[: r % 3]:  # rotate the order, so no arm always runs first
            got, size, ids = one_request(engine, arm, args.tokens)
            steps[arm] += got
            sizes += size
            answers.add(tuple(ids))
            medians[arm] = statistics.median(got)
        for arm in ARMS:
            paired[arm].append(medians[arm] / medians["sdpa"])
    after = load()
    engine.shutdown()
    base = statistics.median(steps["sdpa"])
    report = {
        "machine": {
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "dtype": engine.loaded.facts.dtype,
            "weights_dtype": engine.loaded.facts.weights_dtype,
            "device": engine.loaded.facts.device,
            "load_average_before": before,
            "load_average_after": after,
        },
        "prompt_tokens": len(plan(engine.loaded.tokenizer, parse_generate(request_fields(1)), 8192).ids),
        "rounds": args.rounds,
        "decode_tokens_per_request": args.tokens - 1,
        "arms": {
            arm: {
                "median_step_ms": round(statistics.median(v), 2),
                "quartiles_ms": [round(q, 2) for q in statistics.quantiles(v, n=4)],
                "ratio_to_sdpa": round(statistics.median(v) / base, 3),
                "paired_ratio_median": round(statistics.median(paired[arm]), 3),
                "paired_ratios": [round(x, 3) for x in paired[arm]],
                "steps": len(v),
            }
            for arm, v in steps.items()
        },
        "attention_event_bytes_median": statistics.median(sizes) if sizes else None,
        "same_tokens_in_every_arm": len(answers) == 1,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
