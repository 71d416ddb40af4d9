"""The GPU check for continuous batching, for a machine with CUDA (one short run, ~2 minutes):
the same engine code path as on the CPU, on the bundled model in the GPU's default dtype.

    .venv/bin/python scripts/gpu_check.py            # prints one JSON object; exit 1 on a failed check
    .venv/bin/python scripts/gpu_check.py cpu        # the same on the CPU, to try the script itself

It loads the default model on cuda, runs 8 chat requests one at a time and then all at once,
and reports: greedy tokens identical per request (bf16 batched numerics may flip a rare near-tie:
the count and the first differing index are printed, not hidden), KV bytes measured = formula on
every token event, blocks returned after the run, and aggregate tokens/s batched vs one at a time.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model_runner.engine import Engine, EngineConfig  # noqa: E402
from model_runner.request import parse_generate  # noqa: E402

QUESTIONS = [
    "What does a KV cache store?",
    "Name three colours.",
    "Why is the sky blue?",
    "Write a haiku about the sea.",
    "What is a token?",
    "Explain batching in two sentences.",
    "Say hello.",
    "What is the capital of France?",
]


def ask(question: str):
    return parse_generate({"messages": [{"role": "user", "content": question}], "max_new_tokens": 32})


def run_together(engine, params) -> list[list[dict]]:
    handles = [engine.submit(p, f"t{i}") for i, p in enumerate(params)]
    out: list[list[dict]] = [[] for _ in handles]
    threads = [
        threading.Thread(target=lambda i=i, h=h: out.__setitem__(i, [e.to_dict() for e in h]))
        for i, h in enumerate(handles)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return out


def ids(events) -> list[int]:
    return [e["id"] for e in events if e["type"] == "token"]


def main(device: str) -> int:
    engine = Engine(EngineConfig(model="default", device=device)).start()
    engine.wait_ready(600)
    params = [ask(q) for q in QUESTIONS]
    run_together(engine, params[:2])  # warm-up: kernels, allocator
    t0 = time.monotonic()
    alone = [[e.to_dict() for e in engine.submit(p, f"a{i}")] for i, p in enumerate(params)]
    alone_s = time.monotonic() - t0
    t0 = time.monotonic()
    together = run_together(engine, params)
    together_s = time.monotonic() - t0
    differing = [i for i, (a, b) in enumerate(zip(alone, together)) if ids(a) != ids(b)]
    first_diff = {
        i: next((k for k, (x, y) in enumerate(zip(ids(alone[i]), ids(together[i]))) if x != y), None) for i in differing
    }
    tokens = [e for events in together for e in events if e["type"] == "token"]
    report = {
        "device": engine.facts.device_name,
        "dtype": engine.facts.dtype,
        "identical": len(params) - len(differing),
        "requests": len(params),
        "first_differing_index": first_diff,
        "measured_equals_formula": all(t["cache_bytes_measured"] == t["cache_bytes_formula"] for t in tokens),
        "blocks_held_after": engine.pool.usage().used,
        "alone_tokens_per_s": round(sum(len(ids(a)) for a in alone) / alone_s, 1),
        "together_tokens_per_s": round(sum(len(ids(t)) for t in together) / together_s, 1),
        "max_batch_size": max(t["batch_size"] for t in tokens),
    }
    report["speedup"] = round(report["together_tokens_per_s"] / report["alone_tokens_per_s"], 2)
    engine.shutdown()
    print(json.dumps(report, indent=1))
    ok = report["measured_equals_formula"] and report["blocks_held_after"] == 0 and report["max_batch_size"] > 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "cuda"))
