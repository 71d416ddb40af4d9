"""The class scenario of `kvscope bench --class`: 16 clients (a class of students) with a seeded mix
of short and long prompts and short and long answers (the long prompts share one document and ask
different questions about it), run (a) all at once and (b) arriving at seeded random times over a
few seconds; each with continuous batching and one at a time (max_num_seqs=1), both with prefix
caching on and a cold prefix cache. Reports TTFT, TPOT and ITL distributions, preemptions,
prefix-cache hits and failures, and greedy equality between the two; its part of the report's
contract (SCENARIO) and its table."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from . import report as floor
from .clients import Job, RequestRecord
from .measure import Prompt, fit_prompt, work
from .report import DIST, INT, METRICS, NUM, OPT_NUM, REQUEST, TOTALS, describe, fmt_num, latency_samples

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
        "greedy": floor.greedy_equality(floor.outputs(records["batched"]), floor.outputs(records["serial"])),
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
        **floor.run_summary(records, wall, counters),
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


# ---- the output's contract ----------------------------------------------------------------------

RUN = {
    "type": "object",
    "required": ["requests", "completed", "output_tokens", "wall_s", "tokens_per_s"],
    "properties": {
        "requests": INT,
        "completed": INT,
        "output_tokens": INT,
        "wall_s": NUM,
        "tokens_per_s": OPT_NUM,
        "steps": INT,
        "preemptions": INT,
        "prefix_hit_tokens": INT,
        "totals": TOTALS,
    },
}
EQUALITY = {
    "type": "object",
    "required": ["identical", "compared", "first_diff"],
    "properties": {
        "identical": INT,
        "compared": INT,
        "first_diff": {
            "type": "array",
            "items": {"type": "object", "required": ["request", "token"], "properties": {"request": INT, "token": INT}},
        },
    },
}
OPT_RATIOS = {"type": "object", "additionalProperties": OPT_NUM}
CLASS_RUN = {
    **RUN,
    "required": RUN["required"]
    + [
        "steps",
        "preemptions",
        "prefix_hit_tokens",
        "failures",
        "metrics",
        "by_kind",
        "preempted_requests",
        "prefix_hit_requests",
        "per_request",
    ],
    "properties": {
        **RUN["properties"],
        "failures": INT,
        "preempted_requests": INT,
        "prefix_hit_requests": INT,
        "request_prefix_hit_tokens": INT,
        "metrics": {"type": "object", "required": list(METRICS), "properties": {m: DIST for m in METRICS}},
        "by_kind": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["ttft_ms", "tpot_ms"],
                "properties": {"ttft_ms": DIST, "tpot_ms": DIST},
            },
        },
        "per_request": {"type": "array", "items": REQUEST},
    },
}
SCENARIO = {
    "type": "object",
    "required": ["batched", "serial", "greedy", "ratios"],
    "properties": {
        "batched": CLASS_RUN,
        "serial": CLASS_RUN,
        "greedy": EQUALITY,
        "ratios": {**OPT_RATIOS, "required": ["ttft_p99_over_serial"]},
    },
}

# ---- the table -----------------------------------------------------------------------------------


def eq_text(e: dict | None) -> str:
    return "-" if e is None else f"{e['identical']}/{e['compared']}"


def print_class(c: dict, out: TextIO) -> None:
    kinds = sorted({r["kind"] for r in c["requests"]})
    counts = ", ".join(f"{sum(r['kind'] == k for r in c['requests'])} {k}" for k in kinds)
    print(
        f"\nClass scenario: {c['clients']} clients ({counts}); burst = all at once, arrivals = seeded uniform over "
        f"{c['arrival_s']:g} s (seed {c['seed']}); prefix caching on, cold at the start of each run",
        file=out,
    )
    print(
        f"  {'scenario':<9} {'mode':<8} {'done':>4} {'fail':>4} | {'TTFT p50':>9} {'p95':>8} {'p99':>8} | "
        f"{'TPOT p50':>8} {'p95':>6} {'p99':>6} | {'ITL p50':>7} {'p95':>6} {'p99':>6} | {'tok/s':>6} "
        f"{'preempt':>7} {'prefix hits':>13}",
        file=out,
    )
    for name, sc in c["scenarios"].items():
        for mode in ("batched", "serial"):
            r = sc[mode]
            t, p, i = r["metrics"]["ttft_ms"], r["metrics"]["tpot_ms"], r["metrics"]["itl_ms"]
            print(
                f"  {name:<9} {mode:<8} {r['completed']:>4} {r['failures']:>4} | {fmt_num(t['p50'], 0):>9} "
                f"{fmt_num(t['p95'], 0):>8} {fmt_num(t['p99'], 0):>8} | {fmt_num(p['p50'], 0):>8} {fmt_num(p['p95'], 0):>6} "
                f"{fmt_num(p['p99'], 0):>6} | {fmt_num(i['p50'], 0):>7} {fmt_num(i['p95'], 0):>6} {fmt_num(i['p99'], 0):>6} | "
                f"{fmt_num(r['tokens_per_s']):>6} {r['preemptions']:>7} "
                f"{r['prefix_hit_tokens']:>6} ({r['prefix_hit_requests']} req)",
                file=out,
            )
        q = sc["ratios"]
        print(
            f"  {name:<9} batched/serial: p99 TTFT {fmt_num(q['ttft_p99_over_serial'], 3)}x, p50 TTFT "
            f"{fmt_num(q['ttft_p50_over_serial'], 3)}x, p50 TPOT {fmt_num(q['tpot_p50_over_serial'], 2)}x, tokens/s "
            f"{fmt_num(q['tokens_per_s_over_serial'], 2)}x; greedy identical {eq_text(sc['greedy'])}",
            file=out,
        )
