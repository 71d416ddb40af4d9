"""Chunked prefill: two requests decode; a long prompt arrives. Off: its whole prefill is one step, a
long gap in their token stream. On: it comes in chunks that share steps with their decodes."""

from __future__ import annotations

from model_runner.protocol.metrics import percentile
from serving_experiments.harness import (
    Job,
    Param,
    admit_of,
    ask,
    decode_steps,
    decode_steps_ms,
    job,
    r3,
    text_of_tokens,
)
from serving_experiments.prompts import FILLER, QUESTIONS

PARAMS = {"chunk_size": Param(32, 8, 256), "long_prompt_tokens": Param(192, 64, 1024), "new_tokens": Param(12, 6, 24)}
DECODERS = ("A", "B")


def run(engine, params: dict) -> dict:
    long_text = text_of_tokens(engine, FILLER, params["long_prompt_tokens"])
    runs, long_tokens = {}, None
    for mode in ("off", "on"):
        policy = {"batching": "continuous", "max_num_seqs": 4, "chunked_prefill": mode == "on"}
        if mode == "on":
            policy["chunk_size"] = params["chunk_size"]
        with job(engine, **policy) as j:
            j.submit_together({name: ask(QUESTIONS[i], params["new_tokens"]) for i, name in enumerate(DECODERS)})
            j.pump(lambda: all(decode_steps_ms(j.steps, n) for n in DECODERS))
            j.submit("long", ask(long_text + "\nSum that up in five words.", 2))
            ends = j.wait()
        runs[mode] = summary(j, ends)
        long_tokens = admit_of(j, "long")["prompt_tokens"]
    return {"chunk_size": params["chunk_size"], "long_prompt_tokens": long_tokens, "runs": runs}


def summary(j: Job, ends: dict[str, dict]) -> dict:
    gaps = [token_gaps(j, name) for name in DECODERS]
    flat = [g for gs in gaps for g in gs]
    return {
        "gaps_ms": gaps,
        "max_gap_ms": r3(max(flat)) if flat else None,
        "p95_gap_ms": r3(percentile(flat, 95)),
        "long_ttft_ms": ends["long"]["metrics"]["ttft_ms"],
        "long_prefill_steps": sum(
            1 for s in j.steps if any(r["request"] == "long" and r["kind"] == "prefill" for r in s["batch"])
        ),
    }


def token_gaps(j: Job, name: str) -> list[float | None]:
    """The time between consecutive decode steps of request `name` (its stream's gaps)."""
    times = [s["t_ms"] for s in decode_steps(j.steps, name)]
    return [r3(b - a) for a, b in zip(times, times[1:])]
