"""Why batch: b identical requests at once for each batch size b; a step whose rows are all b decodes
costs step_ms, so each user gets 1000/step_ms tokens a second and the batch b times that. The measured
prefill and full-batch decode steps are placed on the machine's roofline."""

from __future__ import annotations

from typing import Any

from model_runner.metrics import percentile
from serving_experiments import roofline
from serving_experiments.harness import Job, Param, ask, first_prefill_steps, job, prompt_ids, r3
from serving_experiments.prompts import QUESTIONS

BATCHES = (1, 2, 4, 8, 16)
PARAMS = {"new_tokens": Param(4, 3, 16)}


def run(engine, params: dict) -> dict:
    points, decodes, prefill = [], [], None
    for b in BATCHES:
        # a token budget that holds every prompt: all b prefill in one step, then decode in lockstep
        policy = {"batching": "continuous", "max_num_seqs": b, "chunked_prefill": False, "max_batch_tokens": 2048}
        payload = ask(QUESTIONS[0], params["new_tokens"])
        with job(engine, **policy) as j:
            j.submit_together({f"u{i}": payload for i in range(b)})
            j.wait()
        full = full_batch_decode_ms(j, b)
        points.append(point(b, full))
        tokens = len(prompt_ids(engine, payload))
        decodes.append({"batch": b, "ms": min(full, default=None), "context": tokens + params["new_tokens"] / 2})
        if b == 1:
            first = first_prefill_steps(j.steps)
            prefill = {"tokens": tokens, "ms": first[0]["ms"]} if first else None
    result: dict[str, Any] = {"points": points}
    if prefill is not None:
        result["roofline"] = roofline.roofline(engine.local.loaded, prefill, [d for d in decodes if d["ms"]])
    return result


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
