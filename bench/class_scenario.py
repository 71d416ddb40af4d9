"""The class scenario of `kvscope bench --class`: 16 clients (a class of students) with a seeded mix
of short and long prompts and short and long answers (the long prompts share one document and ask
different questions about it), run (a) all at once and (b) arriving at seeded random times over a
few seconds; each with continuous batching and one at a time (max_num_seqs=1), both with prefix
caching on and a cold prefix cache. Reports TTFT, TPOT and ITL distributions, preemptions,
prefix-cache hits and failures, and greedy equality between the two."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .clients import Job, RequestRecord
from .progress import work
from .prompts import Prompt, fit_prompt
from .ratios import greedy_equality, outputs, run_summary
from .stats import describe, latency_samples

CLASS_CLIENTS = 16
# (kind, prompt tokens, max new tokens): four of each in a class of 16, in a seeded order.
MIX = (
    ("short prompt, short answer", 32, 8),
    ("short prompt, long answer", 32, 48),
    ("long prompt, short answer", 256, 8),
    ("long prompt, long answer", 256, 48),
)
QUESTIONS = (
    "Start with prefill.",
    "Focus on memory.",
    "Explain the queue.",
    "Why stream text?",
    "Summarize in plain words.",
    "What costs most?",
    "Give an example.",
    "What limits decoding?",
)
METRICS = ("queue_ms", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


@dataclass(frozen=True)
class ClassRequest:
    kind: str
    prompt: Prompt
    output: int
    delay_s: float  # arrival after the start in the "arrivals" scenario


def requests(
    describe_prompt: Callable, seed: int, arrival_s: float, clients: int = CLASS_CLIENTS
) -> list[ClassRequest]:
    """The class, deterministic for a seed: kinds shuffled, arrival times uniform over arrival_s
    (sorted, so request i is the i-th to arrive)."""
    rng = random.Random(seed)
    kinds = [MIX[i % len(MIX)] for i in range(clients)]
    rng.shuffle(kinds)
    arrivals = sorted(rng.uniform(0, arrival_s) for _ in range(clients))
    out = []
    for i, ((kind, tokens, output), at) in enumerate(zip(kinds, arrivals)):
        long = tokens > MIX[0][1]
        prompt = (
            fit_prompt(describe_prompt, tokens, variant=0, suffix=QUESTIONS[i % len(QUESTIONS)])
            if long
            else fit_prompt(describe_prompt, tokens, variant=i + 1)
        )
        out.append(ClassRequest(kind, prompt, output, round(at, 3)))
    return out


def run(session, classroom: list[ClassRequest]) -> dict[str, Any]:
    """Both scenarios, each batched and one at a time (order alternating), prefix caching on."""
    flush = fit_prompt(session.target.describe, MIX[0][1], variant=99)
    scenarios = {}
    for index, name in enumerate(("burst", "arrivals")):
        jobs = [
            Job(session.payload(r.prompt, r.output), delay_s=r.delay_s if name == "arrivals" else 0.0)
            for r in classroom
        ]
        order = ["batched", "serial"] if index % 2 == 0 else ["serial", "batched"]
        runs, records = {}, {}
        for mode in order:
            weight = sum(work(r.prompt.tokens, r.output) for r in classroom) / (1 if mode == "serial" else 3)
            session.progress.step(f"class, {name}: {mode}", weight)
            session.flush_prefix_cache(flush)
            policy = {"prefix_caching": True, **({"max_num_seqs": 1} if mode == "serial" else {})}
            recs, wall, counters = session.engine_run(jobs, f"class-{name}-{mode}", **policy)
            runs[mode], records[mode] = class_run(recs, wall, counters, classroom, [j.delay_s for j in jobs]), recs
        scenarios[name] = scenario(runs, records)
    return {
        "clients": len(classroom),
        "seed": session.args.seed,
        "arrival_s": session.args.arrival_s,
        "prefix_caching": True,
        "mix": [{"kind": k, "prompt_tokens_target": p, "output_tokens": o} for k, p, o in MIX],
        "requests": [
            {"kind": r.kind, "prompt_tokens": r.prompt.tokens, "output_tokens": r.output, "arrival_s": r.delay_s}
            for r in classroom
        ],
        "scenarios": scenarios,
    }


def scenario(runs: dict[str, dict], records: dict[str, list[RequestRecord]]) -> dict[str, Any]:
    b, s = runs["batched"], runs["serial"]
    return {
        **runs,
        "greedy": greedy_equality(outputs(records["batched"]), outputs(records["serial"])),
        "ratios": {
            "ttft_p99_over_serial": _over(b, s, "ttft_ms", "p99"),
            "ttft_p50_over_serial": _over(b, s, "ttft_ms", "p50"),
            "tpot_p50_over_serial": _over(b, s, "tpot_ms", "p50"),
            "tokens_per_s_over_serial": (
                round(b["tokens_per_s"] / s["tokens_per_s"], 4) if b["tokens_per_s"] and s["tokens_per_s"] else None
            ),
        },
        "_records": records["batched"] + records["serial"],
    }


def _over(a: dict, b: dict, metric: str, stat: str) -> float | None:
    x, y = a["metrics"][metric][stat], b["metrics"][metric][stat]
    return round(x / y, 4) if x is not None and y else None


def class_run(
    records: list[RequestRecord], wall: float, counters: dict, classroom: list[ClassRequest], delays: list[float]
) -> dict:
    """One run of the class: distributions over completed requests (all, and TTFT/TPOT per kind),
    failures, preemptions and prefix-cache hits (the engine's counters and per request)."""
    ok = [r for r in records if r.outcome == "completed"]
    pooled = latency_samples(ok)
    kinds: dict[str, dict] = {}
    for kind, _, _ in MIX:
        mine = [r for r, c in zip(records, classroom) if c.kind == kind and r.outcome == "completed"]
        kinds[kind] = {
            "ttft_ms": describe([r.ttft_ms for r in mine if r.ttft_ms is not None]),
            "tpot_ms": describe([r.tpot_ms for r in mine if r.tpot_ms is not None]),
        }
    return {
        **run_summary(records, wall, counters),
        "failures": len(records) - len(ok),
        "metrics": {m: describe(pooled[m]) for m in METRICS},
        "by_kind": kinds,
        "preempted_requests": sum(r.preemptions > 0 for r in records),
        "prefix_hit_requests": sum(r.prefix_hit_tokens > 0 for r in records),
        "request_prefix_hit_tokens": sum(r.prefix_hit_tokens for r in records),
        "per_request": [
            {
                **r.to_dict(),
                "kind": c.kind,
                "arrival_s": d,
                "prefix_hit_tokens": r.prefix_hit_tokens,
                "preemptions": r.preemptions,
            }
            for r, c, d in zip(records, classroom, delays)
        ],
    }
