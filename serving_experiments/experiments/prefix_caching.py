"""Prefix caching: the same system prompt before different questions, one request after another, with
prefix caching off and then on: with it on, later requests find the prompt's full blocks in the cache."""

from __future__ import annotations

from serving_experiments.harness import Job, Param, admit_of, ask, job
from serving_experiments.prompts import NAMES, QUESTIONS, SYSTEM

PARAMS = {"requests": Param(3, 2, 4), "new_tokens": Param(2, 1, 8)}


def run(engine, params: dict) -> dict:
    block_size = engine.snapshot()["kv"]["block_size"]
    runs = {}
    for mode in ("off", "on"):  # off first: turning it off drops any cached blocks, so "on" starts cold
        with job(engine, prefix_caching=mode == "on", chunked_prefill=False) as j:
            for i in range(params["requests"]):
                j.submit(NAMES[i], ask(QUESTIONS[i], params["new_tokens"], SYSTEM))
                j.wait()
        runs[mode] = {"requests": rows(j, block_size)}
    system_tokens = len(engine.local.loaded.tokenizer.encode(SYSTEM)[0])
    return {"system_prompt_tokens": system_tokens, "block_size": block_size, "runs": runs}


def rows(j: Job, block_size: int) -> list[dict]:
    out = []
    for name, handle in j.handles.items():
        admit = admit_of(j, name)
        end = handle.terminal.to_dict()
        out.append(
            {
                "request": name,
                "ttft_ms": end["metrics"]["ttft_ms"],
                "prompt_tokens": admit["prompt_tokens"],
                "prefill_tokens": admit["prompt_tokens"] - admit["cached_tokens"],
                "cached_tokens": admit["cached_tokens"],
                # the full blocks it took from the prefix cache instead of computing them
                "shared_blocks": admit["cached_tokens"] // block_size,
            }
        )
    return out
