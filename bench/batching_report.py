"""How a `kvscope bench --batching` / `--class` run is shown: its JSON contract (checked with
stats.validate before the file is written) and the readable tables."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from typing import TextIO

from .report import fmt_num, fmt_ratio, write_json
from .stats import DIST, INT, NUM, OPT_NUM, RATIO, REQUEST, STR, TOTALS

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
THROUGHPUT = {
    "type": "object",
    "required": ["clients", "repeat", "order", "batched", "serial", "hf", "greedy", "ratios"],
    "properties": {
        "clients": INT,
        "repeat": INT,
        "order": {"type": "array", "items": STR},
        "batched": RUN,
        "serial": RUN,
        "hf": {**RUN, "type": ["object", "null"]},
        "greedy": {
            "type": "object",
            "required": ["batched_vs_serial", "hf_vs_serial"],
            "properties": {"batched_vs_serial": EQUALITY, "hf_vs_serial": {**EQUALITY, "type": ["object", "null"]}},
        },
        "ratios": {**OPT_RATIOS, "required": ["batched_over_serial", "batched_over_hf"]},
    },
}
CLASS_METRICS = ("queue_ms", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
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
        "metrics": {"type": "object", "required": list(CLASS_METRICS), "properties": {m: DIST for m in CLASS_METRICS}},
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
SCHEMA = {
    "type": "object",
    "required": [
        "kind",
        "version",
        "mode",
        "started_at",
        "duration_s",
        "command",
        "machine",
        "model",
        "settings",
        "throughput",
        "lone",
        "class",
        "ratios",
        "totals",
        "notes",
    ],
    "properties": {
        "kind": {"enum": ["kvscope-bench-batching"]},
        "version": {"enum": [1]},
        "mode": {"enum": ["in-process"]},
        "started_at": STR,
        "duration_s": NUM,
        "command": STR,
        "machine": {"type": "object"},
        "model": {"type": "object", "required": ["name", "params"]},
        "settings": {
            "type": "object",
            "required": [
                "prompt_tokens_target",
                "output_tokens",
                "concurrency",
                "repeats",
                "policy",
                "kv_blocks",
                "seed",
                "arrival_s",
            ],
        },
        "throughput": {"type": "array", "items": THROUGHPUT},
        "lone": {"type": ["object", "null"], "required": ["comparisons"]},
        "class": {
            "type": ["object", "null"],
            "required": ["clients", "requests", "scenarios"],
            "properties": {
                "clients": INT,
                "requests": {"type": "array"},
                "scenarios": {"type": "object", "additionalProperties": SCENARIO},
            },
        },
        "ratios": {"type": "object", "additionalProperties": RATIO},
        "totals": TOTALS,
        "notes": {"type": "array", "items": STR},
    },
}


def finish(report: dict, args: argparse.Namespace, started_at: datetime, out: TextIO | None = None) -> int:
    """Print and write. Exit code 1 when a request ended in an error (the numbers are still written)."""
    out = out or sys.stdout
    print_report(report, out)
    path = write_json(report, args.json, started_at, SCHEMA, "bench-batching")
    print(f"\nwrote {path}", file=out)
    return 1 if report["totals"]["errors"] else 0


def print_report(report: dict, out: TextIO) -> None:
    m, machine, s = report["model"], report["machine"], report["settings"]
    start, end = machine.get("load_average_start"), machine.get("load_average_end")
    print(
        f"\nkvscope bench (continuous batching): {m['name']}, {m['params'] / 1e6:.1f}M parameters, {m['dtype']} "
        f"on {m['device_name']}; in-process engine",
        file=out,
    )
    print(
        f"machine: {machine['platform']}, {machine['cpu_count']} CPUs, {machine['torch_threads']} torch threads"
        + (f"; load average {start[0]:.2f} at the start, {end[0]:.2f} at the end" if start and end else ""),
        file=out,
    )
    print(f"command: {report['command']}", file=out)
    print(f"policy: {', '.join(f'{k}={v}' for k, v in s['policy'].items())}; KV pool {s['kv_blocks']} blocks", file=out)
    if report["throughput"]:
        _throughput(report["throughput"], s, out)
    if report["lone"]:
        _lone(report["lone"], out)
    if report["class"]:
        _class(report["class"], out)
    _ratios(report["ratios"], out)
    t = report["totals"]
    print(
        f"\nTotals: {t['requests']} engine requests: {t['completed']} completed, {t['timeouts']} timeouts, "
        f"{t['cancelled']} cancelled, {t['errors']} errors",
        file=out,
    )
    for note in report["notes"]:
        print(f"note: {note}", file=out)


def _eq(e: dict | None) -> str:
    return "-" if e is None else f"{e['identical']}/{e['compared']}"


def _throughput(rows: list[dict], s: dict, out: TextIO) -> None:
    print(
        f"\nAggregate tokens/s, the same requests (prompts of {min(s['prompt_tokens'])}-{max(s['prompt_tokens'])} "
        f"tokens, up to {s['output_tokens']} new) batched, one at a time (max_num_seqs=1) and through transformers' "
        "generate_batch; greedy = requests token-for-token identical to one at a time",
        file=out,
    )
    print(
        "  (HF tokens/s over its generation span, first request created -> last finished; 'HF call' over the "
        "whole generate_batch call, manager start and stop included)",
        file=out,
    )
    print(
        f"  {'clients':>7} {'rep':>3} {'order':<22} | {'batched':>8} {'serial':>7} {'HF':>7} {'HF call':>7} tok/s | "
        f"{'b/serial':>8} {'b/HF':>6} {'HF/serial':>9} | {'steps b/s':>9} | greedy b=s HF=s",
        file=out,
    )
    for r in rows:
        hf, q = r["hf"] or {}, r["ratios"]
        print(
            f"  {r['clients']:>7} {r['repeat'] + 1:>3} {','.join(r['order']):<22} | "
            f"{fmt_num(r['batched']['tokens_per_s']):>8} {fmt_num(r['serial']['tokens_per_s']):>7} "
            f"{fmt_num(hf.get('tokens_per_s')):>7} {fmt_num(hf.get('call_tokens_per_s')):>7}       | "
            f"{fmt_num(q['batched_over_serial'], 2):>7}x "
            f"{fmt_num(q['batched_over_hf'], 2):>5}x {fmt_num(q['hf_over_serial'], 2):>8}x | "
            f"{r['batched']['steps']:>4}/{r['serial']['steps']:<4} | {_eq(r['greedy']['batched_vs_serial']):>10} "
            f"{_eq(r['greedy']['hf_vs_serial']):>4}",
            file=out,
        )


def _lone(lone: dict, out: TextIO) -> None:
    print(
        f"\nLone client ({lone['prompt_tokens']}-token prompt, up to {lone['output_tokens_target']} new): engine "
        "(max_num_seqs=1, stepped on the bare loop's thread) vs the bare greedy loop",
        file=out,
    )
    for c in lone["comparisons"]:
        e, b = c["engine"] or {}, c["bare_loop"] or {}
        print(
            f"  repeat {c['repeat'] + 1} ({','.join(c['order'])}): step ms engine {fmt_num(e.get('step_ms_median'))}, "
            f"bare {fmt_num(b.get('step_ms_median'))} -> {fmt_num(c['ratios']['engine_step_over_bare'], 3)}x; "
            f"greedy identical: {c['greedy_identical']}",
            file=out,
        )


def _class(c: dict, out: TextIO) -> None:
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
            f"{fmt_num(q['tokens_per_s_over_serial'], 2)}x; greedy identical {_eq(sc['greedy'])}",
            file=out,
        )


def _ratios(ratios: dict, out: TextIO) -> None:
    print("\nRatios: median [min-max] over the repeats, against the targets (benchmarks, not tests)", file=out)
    for r in ratios.values():
        goal = "" if r["target"] is None else f"{'<=' if r['direction'] == 'max' else '>='} {r['target']:g}"
        verdict = {True: "met", False: "MISSED", None: ""}[r["met"]]
        print(f"  {r['what']:<66} {fmt_ratio(r['spread'], 3):>24} {goal:>8} {verdict}", file=out)
