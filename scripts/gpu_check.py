"""The GPU check for continuous batching, for a machine with CUDA (one short run, ~2 minutes):
the same engine code path as on the CPU, on the bundled model in the GPU's default dtype.

    .venv/bin/python scripts/gpu_check.py            # prints one JSON object; exit 1 on a failed check
    .venv/bin/python scripts/gpu_check.py cpu        # the same on the CPU, to try the script itself

It loads the default model on cuda, runs 8 chat requests one at a time and then all at once,
and reports: greedy tokens identical per request (bf16 batched numerics may flip a rare near-tie:
the count and the first differing index are printed, not hidden), KV bytes measured = formula on
every token event, blocks returned after the run, and aggregate tokens/s batched vs one at a time;
then the same requests together again with chunked prefill and prefix caching on, compared the same way.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model_runner.core.engine import Engine, EngineConfig  # noqa: E402
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


def differences(alone: list[list[dict]], other: list[list[dict]]) -> dict:
    """How many requests produced the same greedy tokens as alone, and where the others first differ."""
    differing = [i for i, (a, b) in enumerate(zip(alone, other)) if ids(a) != ids(b)]
    first = {
        i: next((k for k, (x, y) in enumerate(zip(ids(alone[i]), ids(other[i]))) if x != y), None) for i in differing
    }
    return {"identical": len(alone) - len(differing), "requests": len(alone), "first_differing_index": first}


def token_events(runs: list[list[dict]]) -> list[dict]:
    return [e for events in runs for e in events if e["type"] == "token"]


def main(device: str) -> int:
    t0 = time.monotonic()
    engine = Engine(EngineConfig(model="default", device=device)).start()
    engine.wait_ready(600)
    ready_s = time.monotonic() - t0
    params = [ask(q) for q in QUESTIONS]
    run_together(engine, params[:2])  # warm-up: kernels, allocator
    t0 = time.monotonic()
    alone = [[e.to_dict() for e in engine.submit(p, f"a{i}")] for i, p in enumerate(params)]
    alone_s = time.monotonic() - t0
    t0 = time.monotonic()
    together = run_together(engine, params)
    together_s = time.monotonic() - t0
    # The same requests again with chunked prefill and prefix caching on (the template's system
    # prompt is a shared prefix), still greedy: the tokens must not depend on the policy.
    engine.set_policy(chunked_prefill=True, chunk_size=16, prefix_caching=True)
    hits_before = engine.prefix_hit_tokens
    chunked = run_together(engine, params)
    tokens = token_events(together + chunked)
    report = {
        "device": engine.facts.device_name,
        "dtype": engine.facts.dtype,
        "ready_s": round(ready_s, 1),
        "continuous": differences(alone, together),
        "chunked_prefix_cached": differences(alone, chunked),
        "prefix_hit_tokens": engine.prefix_hit_tokens - hits_before,
        # a request that timed out (a loaded CPU) stops short: its tokens are a prefix, not a mismatch
        "outcomes": sorted({events[-1]["type"] for events in alone + together + chunked}),
        "measured_equals_formula": all(t["cache_bytes_measured"] == t["cache_bytes_formula"] for t in tokens),
        "blocks_held_after": engine.pool.usage().used,
        "alone_tokens_per_s": round(sum(len(ids(a)) for a in alone) / alone_s, 1),
        "together_tokens_per_s": round(sum(len(ids(t)) for t in together) / together_s, 1),
        "max_batch_size": max(t["batch_size"] for t in tokens),
    }
    report["speedup"] = round(report["together_tokens_per_s"] / report["alone_tokens_per_s"], 2)
    engine.shutdown()
    print(json.dumps(report, indent=1))
    ok = (
        report["outcomes"] == ["finished"]
        and report["measured_equals_formula"]
        and report["blocks_held_after"] == 0
        and report["max_batch_size"] > 1
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "cuda"))
