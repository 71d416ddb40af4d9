"""Prefill against decode, the price of a token: one request alone, run twice; its prefill steps' ms
per prompt token against its decode steps' median ms per token, each the better of the two runs (the
slower run measured a busy machine)."""

from __future__ import annotations

from model_runner.protocol.metrics import percentile
from serving_experiments.harness import Param, ask, decode_steps_ms, first_prefill_steps, job, r3, text_of_tokens
from serving_experiments.prompts import FILLER

PARAMS = {"prompt_tokens": Param(128, 16, 1024), "new_tokens": Param(8, 3, 32)}
RUNS = 2


def run(engine, params: dict) -> dict:
    text = text_of_tokens(engine, FILLER, params["prompt_tokens"])
    runs = []
    for _ in range(RUNS):
        with job(engine) as j:
            j.submit("A", ask(text + "\nWhat is this about?", params["new_tokens"]))
            j.wait()
        prefill = first_prefill_steps(j.steps)
        tokens = sum(s["batch"][0]["tokens"] for s in prefill)
        decode = decode_steps_ms(j.steps, "A")
        runs.append({"tokens": tokens, "prefill_ms": sum(s["ms"] for s in prefill), "decode": decode})
    per_prompt = min(r["prefill_ms"] / r["tokens"] for r in runs)
    per_output = min(percentile(r["decode"], 50) for r in runs)
    return {
        "prefill_ms_per_token": r3(per_prompt),
        "decode_ms_per_token": r3(per_output),
        "ratio": r3(per_output / per_prompt),
        "prompt_tokens": runs[0]["tokens"],
        "new_tokens": len(runs[0]["decode"]) + 1,
        "prefill_ms": [r3(r["prefill_ms"]) for r in runs],
        "decode_ms_median": [r3(percentile(r["decode"], 50)) for r in runs],
    }
