"""Why batch: b identical requests at once for each batch size b; a step whose rows are all b decodes
costs step_ms, so each user gets 1000/step_ms tokens a second and the batch b times that. The measured
prefill and full-batch decode steps are placed on the machine's roofline."""

from __future__ import annotations

from typing import Any

from model_runner.protocol.metrics import percentile
from serving_experiments import roofline
from serving_experiments.harness import Job, Param, ask, first_prefill_steps, job, prompt_ids, r3
from serving_experiments.prompts import QUESTIONS

BATCHES = (1, 2, 4, 8, 16)
PARAMS = {"new_tokens": Param(8, 3, 16)}  # 8: seven full-batch decode steps a batch, a median worth the name
PREFILL_RUNS = 3  # the batch-1 run is made this many times, so the prompt's step has a median too


def run(engine, params: dict) -> dict:
    points, decodes, prefills = [], [], []
    payload = ask(QUESTIONS[0], params["new_tokens"])
    tokens = len(prompt_ids(engine, payload))
    for b in BATCHES:
        full = []
        for _ in range(PREFILL_RUNS if b == 1 else 1):
            j = batch_job(engine, payload, b)
            full += full_batch_decode_ms(j, b)
            if b == 1:
                prefills += [s["ms"] for s in first_prefill_steps(j.steps)[:1]]
        points.append(point(b, full))
        decodes.append({"batch": b, "context": tokens + params["new_tokens"] / 2, **spread(full)})
    result: dict[str, Any] = {"points": points}
    if prefills:
        prefill = {"tokens": tokens, **spread(prefills)}
        result["roofline"] = roofline.roofline(engine.local.loaded, prefill, [d for d in decodes if d["ms"]])
    return result


def batch_job(engine, payload: dict, b: int) -> Job:
    """b copies of one request at once, under a token budget that holds every prompt: all b prefill in one
    step, then decode in lockstep."""
    policy = {"batching": "continuous", "max_num_seqs": b, "chunked_prefill": False, "max_batch_tokens": 2048}
    with job(engine, **policy) as j:
        j.submit_together({f"u{i}": payload for i in range(b)})
        j.wait()
    return j


def spread(times: list[float]) -> dict:
    """A step's fastest and median time over the steps measured, and how many (the roofline's evidence)."""
    return {"ms": min(times, default=None), "ms_median": percentile(times, 50), "steps": len(times)}


def full_batch_decode_ms(j: Job, b: int) -> list[float]:
    """The times of the steps whose rows are all b decodes."""
    return [s["ms"] for s in j.steps if len(s["batch"]) == b and all(r["kind"] == "decode" for r in s["batch"])]


def point(b: int, full: list[float]) -> dict:
    # best of the steps, as the machine's ceilings are measured: on a shared CPU the slower
    # repeats measure the neighbours; the median is given beside it
    step_ms = min(full, default=None)
    return {
        "batch": b,
        "step_ms": r3(step_ms),
        "step_ms_median": r3(percentile(full, 50)),
        "per_user_tps": r3(1000 / step_ms) if step_ms else None,
        "aggregate_tps": r3(b * 1000 / step_ms) if step_ms else None,
        "steps_measured": len(full),
    }
