"""`kvscope bench --batch-invariant`: what batch-invariant mode costs, in one run on one in-process engine.
For the default mode and then the mode (switched at run time, the same loaded model): a lone client's
greedy requests one after another, then `--concurrency` clients at once (default 8); tokens/s, TTFT p50/p95,
the median decode step, and how many batched answers were the lone ones. Prints a table and writes JSON."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from typing import Any, TextIO

from model_runner.local.engine import Engine, EngineConfig
from model_runner.protocol.metrics import p50_p95, percentile
from model_runner.protocol.request import parse_generate
from serving_experiments.prompts import QUESTIONS

from . import report as floor
from .measure import load_average, machine_info

MODES = (("default", False), ("invariant", True))


def ask(question: str, tokens: int):
    return parse_generate(
        {"messages": [{"role": "user", "content": question}], "max_new_tokens": tokens, "ignore_eos": True}
    )


def collect(handles: list) -> list[dict]:
    """Each request's terminal event, with its token ids, in the order given."""
    out = []
    for handle in handles:
        events = [e.to_dict() for e in handle]
        end = events[-1]
        if end["type"] != "finished":
            raise RuntimeError(f"a bench request ended with {end['type']}: {end.get('message') or end.get('cause')}")
        out.append({**end, "ids": [e["id"] for e in events if e["type"] == "token"]})
    return out


def phase(engine: Engine, questions: list[str], tokens: int, together: bool) -> dict[str, Any]:
    """The questions one after another (together False) or all at once: wall time, ends, decode steps' ms."""
    steps_before = engine.steps
    t0 = time.monotonic()
    ends: list[dict] = []
    if together:
        with engine.admissions_held():
            handles = [engine.submit(ask(q, tokens)) for q in questions]
        ends = collect(handles)
    else:
        for q in questions:
            ends += collect([engine.submit(ask(q, tokens))])
    wall = time.monotonic() - t0
    generated = sum(e["tokens"] for e in ends)
    ttft = p50_p95([e["metrics"]["ttft_ms"] for e in ends])
    itl = [gap for e in ends for gap in e["metrics"]["itl_ms"]]
    return {
        "requests": len(ends),
        "tokens": generated,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(generated / wall, 2),
        "ttft_ms": ttft,
        "itl_ms_p50": percentile(itl, 50),
        "steps": engine.steps - steps_before,
        "ids": [e["ids"] for e in ends],
    }


def run_invariance(args: argparse.Namespace) -> int:
    clients = max(args.concurrency or (8,))
    tokens = (args.output_lens or (32,))[0]
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(clients)]
    started = datetime.now(timezone.utc)
    load_before = load_average()
    print(f"kvscope bench --batch-invariant: loading {args.model}", file=sys.stderr, flush=True)
    engine = Engine(EngineConfig(model=args.model, device=args.device, dtype=args.dtype, timeout_s=600.0)).start()
    engine.wait_ready(900)
    try:
        phase(engine, questions[:1], 4, together=False)  # warm-up: a fresh process's first steps pay one-off costs
        runs = {}
        for name, on in MODES:
            engine.set_policy(batch_invariant=on)
            if on:
                phase(engine, questions[:1], 4, together=False)  # the mode's own warm-up (its kernel check)
            lone = phase(engine, questions, tokens, together=False)
            batched = phase(engine, questions, tokens, together=True)
            same = sum(a == b for a, b in zip(lone.pop("ids"), batched.pop("ids")))
            runs[name] = {"lone": lone, "batched": batched, "batched_equal_lone": same}
        report = engine.batch_invariance()
        facts = engine.facts
    finally:
        engine.shutdown()
    result = {
        "command": f"kvscope bench --batch-invariant --model {args.model} --concurrency {clients} --output-lens {tokens}",
        "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": machine_info(facts),
        "load_before": load_before,
        "load_after": load_average(),
        "clients": clients,
        "new_tokens": tokens,
        "runs": runs,
        "cost": cost(runs),
        "mode": report,
    }
    return floor.finish(result, args.json, started, print_table, sys.stdout, name="bench-invariance")


def cost(runs: dict) -> dict[str, float | None]:
    """The mode's figures over the default's (tokens/s: below 1 is slower; TTFT: above 1 is later)."""
    out = {}
    for where in ("lone", "batched"):
        a, b = runs["default"][where], runs["invariant"][where]
        out[f"{where}_tokens_per_s"] = round(b["tokens_per_s"] / a["tokens_per_s"], 3)
        p50a, p50b = a["ttft_ms"]["p50"], b["ttft_ms"]["p50"]
        out[f"{where}_ttft_p50"] = round(p50b / p50a, 3) if p50a and p50b else None
    return out


def print_table(result: dict, out: TextIO) -> None:
    n = result["clients"]
    print(
        f"{'mode':<10} {'where':<12} {'tokens/s':>9} {'TTFT p50':>10} {'TTFT p95':>10} {'ITL p50':>9}  batched = lone",
        file=out,
    )
    for name, run in result["runs"].items():
        for where in ("lone", "batched"):
            r = run[where]
            label = "1 client" if where == "lone" else f"{n} clients"
            same = f"{run['batched_equal_lone']} of {n}" if where == "batched" else ""
            print(
                f"{name:<10} {label:<12} {r['tokens_per_s']:>9.1f} {r['ttft_ms']['p50']:>8.0f}ms "
                f"{r['ttft_ms']['p95']:>8.0f}ms {r['itl_ms_p50']:>7.1f}ms  {same}",
                file=out,
            )
    print("mode over default: " + ", ".join(f"{k} ×{v}" for k, v in result["cost"].items()), file=out)
