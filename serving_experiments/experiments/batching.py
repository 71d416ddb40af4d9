"""Static against continuous batching: requests of mixed lengths under one batch size; the short ones
end early and (continuous) free their place at once. Each run is a grid of steps replayed from the feed."""

from __future__ import annotations

import time

from model_runner.protocol.metrics import percentile
from serving_experiments.harness import Job, Param, ask, job, r3
from serving_experiments.prompts import NAMES, QUESTIONS

PARAMS = {"requests": Param(6, 2, 8), "batch_size": Param(3, 1, 8), "new_tokens": Param(10, 4, 16)}


def workload(params: dict) -> list[dict]:
    """Requests of mixed lengths: the short ones end early and (continuous) free their place."""
    n, most = params["requests"], params["new_tokens"]
    lengths = [most if i % 3 == 0 else max(2, most // (2 + i % 3)) for i in range(n)]
    return [{"request": NAMES[i], "question": QUESTIONS[i], "max_new_tokens": lengths[i]} for i in range(n)]


def run(engine, params: dict) -> dict:
    work = workload(params)
    runs, prompt_tokens = {}, {}
    for mode in ("static", "continuous"):
        with job(engine, batching=mode, max_num_seqs=params["batch_size"], chunked_prefill=False) as j:
            t0 = time.monotonic()
            j.submit_together({w["request"]: ask(w["question"], w["max_new_tokens"]) for w in work})
            ends = j.wait()
            wall = time.monotonic() - t0
        runs[mode] = summary(j, ends, wall, params["batch_size"])
        prompt_tokens = {e["request"]: e["prompt_tokens"] for e in j.log if e["type"] == "engine_admit"}
    rows = [
        {
            "request": w["request"],
            "prompt_tokens": prompt_tokens.get(w["request"]),
            "max_new_tokens": w["max_new_tokens"],
        }
        for w in work
    ]
    return {"workload": rows, "batch_size": params["batch_size"], "runs": runs}


def grid(j: Job) -> list[dict]:
    """One row per step of ours: what each request did in it, replayed from the feed in order."""
    state = {name: "waiting" for name in j.handles}
    rows = []
    for event in j.log:
        kind, name = event["type"], event.get("request")
        if kind == "engine_admit":
            state[name] = "idle"  # running: its place in the batch is held, its work comes in the step
        elif kind == "engine_preempt":
            state[name] = "preempted"
        elif kind == "engine_end":
            state[name] = "done"
        elif kind == "engine_step":
            ran = {r["request"]: ("decode" if r["kind"] == "decode" else "prefill") for r in event["batch"]}
            cells = {n: ran.get(n, state[n]) for n in j.handles}
            rows.append({"step": len(rows) + 1, "ms": event["ms"], "cells": cells})
    return rows


def summary(j: Job, ends: dict[str, dict], wall_s: float, slots: int) -> dict:
    steps = grid(j)
    tokens = sum(e["tokens"] for e in ends.values())
    busy = sum(sum(1 for c in s["cells"].values() if c in ("prefill", "decode")) for s in steps)
    return {
        "steps": steps,
        "throughput_tps": r3(tokens / wall_s) if wall_s > 0 else None,
        "p95_latency_ms": r3(percentile([e["metrics"]["e2e_ms"] for e in ends.values()], 95)),
        "idle_slot_share": r3(1 - busy / (len(steps) * slots)) if steps else None,
        "tokens": tokens,
        "wall_ms": r3(wall_s * 1000),
    }
