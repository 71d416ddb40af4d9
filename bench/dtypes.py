"""`kvscope bench --dtypes`: the same model loaded once per dtype route (default float32 and auto) in
one process, each in its own engine, all stepped on one thread; in turns whose order rotates every
repeat, a lone client (decode tokens/s, prefill) and N concurrent clients (aggregate tokens/s); then
greedy answers to the fixed quality prompts, one at a time, compared token for token with the first
route's; ratios against the first route, weights and KV-cache bytes per token."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any, TextIO

import torch

from model_runner.errors import UserError
from model_runner.loading.loader import DTYPE_CHOICES

from .clients import Job, RequestRecord, _read, _submit
from .prompts import fit_prompt
from .ratios import greedy_equality, judged, outputs
from .stats import spread

DEFAULT_ROUTES = "float32,auto"
QUALITY_FILE = Path("data") / "quality_prompts.json"
DEFAULTS = {"prompt": 64, "output": 32, "clients": 8, "repeats": 3, "quality_tokens": 32}
LONE_GOAL = ("min", 2.5)  # issue 17: the new default's lone decode tokens/s over float32's
BATCHED_GOAL = ("min", 1.0)  # and no lower aggregate tokens/s at 8 clients


def parse_routes(text: str) -> list[str]:
    routes = [r.strip() for r in text.split(",") if r.strip()]
    bad = [r for r in routes if r not in DTYPE_CHOICES]
    if bad or len(routes) < 2 or len(set(routes)) != len(routes):
        raise UserError(
            f"--dtypes takes two or more different values of {', '.join(DTYPE_CHOICES)}, comma-separated "
            f"(the first is the reference), got {text!r}",
            field="dtypes",
        )
    return routes


def quality_prompts() -> dict:
    """The fixed chat prompts (static/data/quality_prompts.json) the quality guard uses too: in the source
    checkout's static/, or installed beside bench/ as app/static/ (bench/ does not import app/)."""
    top = Path(__file__).resolve().parent.parent
    for static in (top / "static", top / "app" / "static"):
        if (static / QUALITY_FILE).is_file():
            return json.loads((static / QUALITY_FILE).read_text())
    raise UserError(f"{QUALITY_FILE} is missing from this installation of kvscope", field="dtypes")


def quality_messages(data: dict) -> list[list[dict[str, str]]]:
    return [[{"role": "system", "content": data["system"]}, {"role": "user", "content": p}] for p in data["prompts"]]


def agreement(got: list[list[int] | None], reference: list[list[int] | None]) -> dict:
    """greedy_equality plus the share of answers identical and the share of reference tokens matched
    before each answer's first difference."""
    eq = greedy_equality(got, reference)
    pairs = [(a, b) for a, b in zip(got, reference) if a is not None and b is not None]
    same = sum(next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b))) for a, b in pairs)
    total = sum(len(b) for _, b in pairs)
    return {
        **eq,
        "identical_share": round(eq["identical"] / eq["compared"], 4) if eq["compared"] else None,
        "tokens_before_divergence_share": round(same / total, 4) if total else None,
    }


# ---- one run -----------------------------------------------------------------------------------


def _engine(args: argparse.Namespace, dtype: str, clients: int):
    """A loaded engine whose worker thread never starts: the bench's one thread runs every route's
    steps (run_stepped_all), so no route is helped or hurt by which thread torch runs on (two idle
    OpenMP teams beside a busy one cost the small int4/int8 steps most; docs/performance.md)."""
    from model_runner.core.engine import Engine, EngineConfig
    from model_runner.loading.loader import load

    config = EngineConfig(
        model=args.model, device=args.device, dtype=dtype, max_queue=max(64, clients), timeout_s=600.0
    )
    return Engine(config, loaded=load(args.model, args.device, dtype))


def run_stepped_all(engine, payloads: list[dict], prefix: str) -> tuple[list[RequestRecord], float]:
    """All the requests submitted at once, then this thread runs the engine's step() until every one
    has ended (readers take their events meanwhile); (records, first send -> last terminal event)."""
    records = [RequestRecord(f"{prefix}-{i}") for i in range(len(payloads))]
    handles = [_submit(engine, Job(p), r, lambda: None) for p, r in zip(payloads, records)]
    readers = [
        threading.Thread(target=_read, args=(h, Job(p), r), name="bench-reader", daemon=True)
        for h, p, r in zip(handles, payloads, records)
        if h is not None
    ]
    for reader in readers:
        reader.start()
    with torch.inference_mode():  # as the engine's worker runs its steps
        while not all(h is None or h.done for h in handles):
            engine.step()
    for reader in readers:
        reader.join()
    starts = [r.sent for r in records if r.sent is not None]
    ends = [r.end_at for r in records if r.end_at is not None]
    return records, (max(ends) - min(starts) if starts and ends else 0.0)


def _lone(engine, payload: dict, tag: str) -> dict:
    (record,), _ = run_stepped_all(engine, [payload], tag)
    if record.outcome != "completed":
        raise UserError(f"{tag}: the lone request ended {record.outcome} ({record.message})", code="bench_failed")
    steps = record.step_ms[1:]  # the first token's step is the prefill
    return {
        "tokens": len(record.token_ids),
        "prefill_ms": record.prefill_ms,
        "ttft_ms": record.ttft_ms,
        "tpot_ms": record.tpot_ms,
        "decode_tokens_per_s": 1000 / record.tpot_ms if record.tpot_ms else None,
        "step_ms_median": median(steps) if steps else None,
    }


def _batched(engine, payloads: list[dict], tag: str) -> dict:
    records, wall = run_stepped_all(engine, payloads, tag)
    ok = [r for r in records if r.outcome == "completed"]
    tokens = sum(len(r.token_ids) for r in ok)
    return {"clients": len(payloads), "completed": len(ok), "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall if wall > 0 and tokens else None}  # fmt: skip


def run_dtypes(args: argparse.Namespace) -> int:
    routes = parse_routes(args.dtypes)
    if args.via_websocket or args.batching or args.class_scenario or args.quick:
        raise UserError(
            "--dtypes runs its own in-process engines, one per route; leave out --via-websocket, --batching, "
            "--class and --quick",
            field="dtypes",
        )
    prompt_target = (args.prompt_lens or (DEFAULTS["prompt"],))[0]
    output = (args.output_lens or (DEFAULTS["output"],))[0]
    clients = (args.concurrency or (DEFAULTS["clients"],))[0]
    repeats = args.repeats or DEFAULTS["repeats"]
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.WARNING)
    from .runner import _load, machine_info

    started_at, t0 = datetime.now(UTC), time.monotonic()
    engines: dict[str, Any] = {}
    for route in routes:
        print(f"kvscope bench --dtypes: loading {args.model} with --dtype {route}", file=sys.stderr, flush=True)
        engines[route] = _engine(args, route, clients)
    report = measure(args, engines, prompt_target, output, clients, repeats)
    report["machine"] = {
        **machine_info(engines[routes[0]].loaded.facts),
        "load_average_start": report.pop("_load_start"),
        "load_average_end": _load(),
    }
    report["started_at"] = started_at.isoformat(timespec="seconds")
    report["duration_s"] = round(time.monotonic() - t0, 1)
    print_report(report, sys.stdout)
    path = args.json or f"bench-dtypes-{started_at.strftime('%Y%m%d-%H%M%S')}.json"
    with open(path, "w") as f:
        json.dump(report, f, indent=1, allow_nan=False)
    print(f"\nwrote {path}")
    return 0


def measure(args, engines: dict, prompt_target: int, output: int, clients: int, repeats: int) -> dict:
    from .runner import _load

    routes = list(engines)
    load_start = _load()
    first = engines[routes[0]]
    prompts = [fit_prompt(first.describe_prompt, prompt_target, variant=i) for i in range(clients)]
    payloads = [{"messages": p.messages, "max_new_tokens": output} for p in prompts]
    for route in routes:  # warm-up, untimed: a lone request and a small batch
        _batched(engines[route], [{**p, "max_new_tokens": 4} for p in payloads[:4]], f"warm-{route}")
    runs: dict[str, dict[str, list]] = {r: {"lone": [], "batched": []} for r in routes}
    for rep in range(repeats):
        order = routes[rep % len(routes) :] + routes[: rep % len(routes)]
        for route in order:
            print(f"  repeat {rep + 1}/{repeats}: {route}", file=sys.stderr, flush=True)
            runs[route]["lone"].append(_lone(engines[route], payloads[0], f"lone-{route}-r{rep}"))
            runs[route]["batched"].append(_batched(engines[route], payloads, f"batch-{route}-r{rep}"))
    data = quality_prompts()
    quality = [{"messages": m, "max_new_tokens": DEFAULTS["quality_tokens"]} for m in quality_messages(data)]
    answers = {}
    for route in routes:
        print(f"  quality prompts: {route}", file=sys.stderr, flush=True)
        engine = engines[route]  # one at a time, as the quality guard runs them: no batch effects
        answers[route] = [
            outputs(run_stepped_all(engine, [p], f"quality-{route}-{i}")[0])[0] for i, p in enumerate(quality)
        ]
    rows = {route: _row(engines[route], runs[route], answers[route], answers[routes[0]]) for route in routes}
    return {
        "kind": "kvscope-bench-dtypes",
        "version": 1,
        "command": _command(args, routes, prompt_target, output, clients, repeats),
        "_load_start": load_start,
        "settings": {
            "routes": routes,
            "prompt_tokens": prompts[0].tokens,
            "output_tokens": output,
            "clients": clients,
            "repeats": repeats,
            "quality_prompts": len(quality),
            "quality_tokens": DEFAULTS["quality_tokens"],
            "sampling": "greedy",
        },  # fmt: skip
        "routes": rows,
        "ratios": _ratios(rows, runs, routes, clients),
    }


def _row(engine, runs: dict, answers: list, reference: list) -> dict:
    facts = engine.loaded.facts
    lone = [r["decode_tokens_per_s"] for r in runs["lone"] if r["decode_tokens_per_s"]]
    batched = [r["tokens_per_s"] for r in runs["batched"] if r["tokens_per_s"]]
    return {
        "facts": facts.to_dict(),
        "load_s": round(engine.loaded.load_s, 2),
        "measured_kv_bytes_per_token": engine.pool.measured_bytes(1),
        "lone_decode_tokens_per_s": spread(lone),
        "prefill_ms": spread([r["prefill_ms"] for r in runs["lone"] if r["prefill_ms"] is not None]),
        "step_ms": spread([r["step_ms_median"] for r in runs["lone"] if r["step_ms_median"] is not None]),
        "batched_tokens_per_s": spread(batched),
        "agreement": agreement(answers, reference),
        "runs": runs,
    }


def _ratios(rows: dict, runs: dict, routes: list[str], clients: int) -> dict:
    """Each route over the reference, repeat by repeat (the same turn of the same run), then the median."""
    ref, report = routes[0], {}
    for route in routes[1:]:
        for key, field_, goal, what in (
            ("lone", "decode_tokens_per_s", LONE_GOAL, "lone client: decode tokens/s"),
            ("batched", "tokens_per_s", BATCHED_GOAL, f"{clients} clients: aggregate tokens/s"),
        ):
            values = [
                a[field_] / b[field_] for a, b in zip(runs[route][key], runs[ref][key]) if a[field_] and b[field_]
            ]
            value = median(values) if values else None
            report[f"{key}_{route}_over_{ref}"] = judged(f"{what}, {route} / {ref}", spread(values), value, goal)
    return report


def _command(args, routes, prompt_target, output, clients, repeats) -> str:
    parts = ["kvscope bench", f"--dtypes {','.join(routes)}", f"--model {args.model}"]
    parts += [f"--device {args.device}"] if args.device != "auto" else []
    parts += [f"--prompt-lens {prompt_target}", f"--output-lens {output}", f"--concurrency {clients}"]
    return " ".join(parts + [f"--repeats {repeats}"])


# ---- the table ---------------------------------------------------------------------------------


def _f(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def print_report(report: dict, out: TextIO) -> None:
    machine, s = report["machine"], report["settings"]
    start, end = machine.get("load_average_start"), machine.get("load_average_end")
    print(
        f"\nkvscope bench --dtypes: {s['prompt_tokens']}-token prompt, {s['output_tokens']} new tokens, "
        f"{s['clients']} clients batched, {s['repeats']} repeats (order rotating), greedy",
        file=out,
    )
    print(
        f"machine: {machine['platform']}, {machine['cpu_count']} CPUs, {machine['torch_threads']} torch threads"
        + (f"; load average {start[0]:.2f} at the start, {end[0]:.2f} at the end" if start and end else ""),
        file=out,
    )
    print(f"command: {report['command']}\n", file=out)
    head = ("--dtype", "weights", "KV", "lone tok/s", "prefill ms", f"@{s['clients']} tok/s", "weights MB",
            "KV B/token", "load s", "identical")  # fmt: skip
    print("  ".join(f"{h:>12}" for h in head), file=out)
    for route, row in report["routes"].items():
        f, a = row["facts"], row["agreement"]
        cells = (
            route,
            f["weights_dtype"],
            f["kv_dtype"],
            _f(row["lone_decode_tokens_per_s"]["median"]),
            _f(row["prefill_ms"]["median"]),
            _f(row["batched_tokens_per_s"]["median"]),
            _f(f["weights_bytes"] / 1e6),
            f"{f['kv_bytes_per_token']:,}",
            _f(row["load_s"], 2),
            f"{a['identical']}/{a['compared']}",
        )
        print("  ".join(f"{c:>12}" for c in cells), file=out)
    for route, row in report["routes"].items():
        f = row["facts"]
        print(f"\n{route}: {f['dtype_reason'] or f['dtype_route']}; quantization: {f['quantization']}", file=out)
        a = row["agreement"]
        if a["first_diff"]:
            firsts = ", ".join(f"#{d['request']}@{d['token']}" for d in a["first_diff"])
            print(
                f"  vs the reference: {a['identical']}/{a['compared']} answers identical, "
                f"{a['tokens_before_divergence_share']:.0%} of tokens before the first difference; "
                f"first differences (prompt@token): {firsts}",
                file=out,
            )
    print("\nratios (median over repeats [min-max]) and issue 17's targets:", file=out)
    for r in report["ratios"].values():
        sp = r["spread"]
        verdict = {True: "met", False: "MISSED", None: "-"}[r["met"]]
        print(
            f"  {r['what']}: {_f(r['value'], 2)}x [{_f(sp.get('min'), 2)}-{_f(sp.get('max'), 2)}] "
            f"(target {r['direction']} {r['target']}: {verdict})",
            file=out,
        )
