"""`kvscope bench --dtypes`: the same model loaded once per dtype route (default float32 and auto; a route
may name its decoder, `auto:transformers`, so one run compares the native step with transformers') in
one process, each in its own engine, all stepped on one thread; in turns whose order rotates every
repeat, a lone client (decode tokens/s, prefill) and N concurrent clients (aggregate tokens/s); then
greedy answers to the fixed quality prompts, one at a time, compared token for token with the first
route's; ratios against the first route, weights and KV-cache bytes per token; with `--anchor
llamacpp`, llama.cpp on the same GGUF and token ids in the same run (bench/anchor.py); with `--anchor
vllm`, llama.cpp and then vLLM's CPU build too, started only after the engine's turns."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any, TextIO

from model_runner.loading.loader import DTYPE_CHOICES
from model_runner.local.config import DECODERS
from model_runner.protocol.errors import UserError

from . import anchor
from . import report as floor
from .clients import Job, RequestRecord, run_stepped_all
from .measure import fit_prompt, load_average, machine_info
from .report import agreement, fmt_num, judged, outputs, spread

DEFAULT_ROUTES = "float32,auto"
QUALITY_FILE = Path("data") / "quality_prompts.json"
DEFAULTS = {"prompt": 64, "output": 32, "clients": 8, "repeats": 3, "quality_tokens": 32}
LONE_GOAL = ("min", 2.5)  # the project's target: the default's lone decode tokens/s over float32's
BATCHED_GOAL = ("min", 1.5)  # aggregate tokens/s at 8 clients
PREFILL_GOAL = ("max", 1.0)  # prefill time no longer than float32's
# The native decoder step against transformers' on the same route: lone decode, and the batched clients (16).
DECODER_LONE_GOAL = ("min", 1.25)
DECODER_BATCHED_GOAL = ("min", 1.2)


COMPILED = "compiled"  # a route's third part: its decode stretches compiled ahead of time (`--compile on`)


def split_route(route: str) -> tuple[str, str]:
    """`dtype`, `dtype:decoder` or `dtype:decoder:compiled` → (dtype, decoder); the decoder defaults to auto."""
    dtype, _, decoder = route.partition(":")
    return dtype, decoder.partition(":")[0] or "auto"


def compiled_route(route: str) -> bool:
    """Whether `route` runs its decode stretches compiled ahead of time (model_runner/local/model/compiled.py)."""
    return route.split(":")[2:] == [COMPILED]


def parse_routes(text: str) -> list[str]:
    routes = [r.strip() for r in text.split(",") if r.strip()]
    bad = [
        r
        for r in routes
        if split_route(r)[0] not in DTYPE_CHOICES
        or split_route(r)[1] not in DECODERS
        or r.split(":")[2:] not in ([], [COMPILED])
    ]
    if bad or len(routes) < 2 or len(set(routes)) != len(routes):
        raise UserError(
            f"--dtypes takes two or more different values of {', '.join(DTYPE_CHOICES)}, comma-separated "
            f"(the first is the reference), each optionally with :{'|:'.join(DECODERS)} for its decoder and then "
            f":{COMPILED} for its decode stretches compiled ahead of time, got {text!r}",
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


# ---- one run -----------------------------------------------------------------------------------


def _engine(args: argparse.Namespace, route: str, clients: int):
    """A loaded engine whose worker thread never starts: the bench's one thread runs every route's
    steps (run_stepped_all), so no route is helped or hurt by which thread torch runs on (two idle
    OpenMP teams beside a busy one cost the small int4/int8 steps most; docs/history/2026-12-02-performance.md,
    "A faster lone stream on a CPU")."""
    from model_runner.loading.loader import load
    from model_runner.local.engine import Engine, EngineConfig

    dtype, decoder = split_route(route)
    config = EngineConfig(
        model=args.model,
        device=args.device,
        dtype=dtype,
        max_queue=max(64, clients),
        timeout_s=600.0,
        decoder=decoder,
        compile="on" if compiled_route(route) else "off",
    )
    engine = Engine(config, loaded=load(args.model, args.device, dtype))
    compiled = engine.compiled(wait=True)  # measured once the library runs, not while it builds
    if compiled_route(route) and compiled["state"] != "on":
        raise UserError(f"{route}: the decode stretches did not compile: {compiled['reason']}", field="dtypes")
    return engine


def _stepped(engine, payloads: list[dict], tag: str) -> tuple[list[RequestRecord], float]:
    """The payloads submitted at once, stepped on this thread (clients.run_stepped_all), named TAG-i."""
    return run_stepped_all(engine, [Job(p) for p in payloads], [f"{tag}-{i}" for i in range(len(payloads))])


def _lone(engine, payload: dict, tag: str) -> dict:
    (record,), _ = _stepped(engine, [payload], tag)
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
        "median_gap_ms": median(record.itl_ms) if len(record.token_at) > 1 else None,  # a typical token
    }


def _batched(engine, payloads: list[dict], tag: str) -> dict:
    records, wall = _stepped(engine, payloads, tag)
    ok = [r for r in records if r.outcome == "completed"]
    tokens = sum(len(r.token_ids) for r in ok)
    return {"clients": len(payloads), "completed": len(ok), "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall if wall > 0 and tokens else None}  # fmt: skip


def run_dtypes(args: argparse.Namespace) -> int:
    routes = parse_routes(args.dtypes or DEFAULT_ROUTES)  # `--anchor llamacpp` alone compares the default routes
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

    started_at, t0 = datetime.now(UTC), time.monotonic()
    engines: dict[str, Any] = {}
    for route in routes:
        print(f"kvscope bench --dtypes: loading {args.model} with --dtype {route}", file=sys.stderr, flush=True)
        engines[route] = _engine(args, route, clients)
    report = measure_routes(args, engines, prompt_target, output, clients, repeats)
    report["machine"] = {
        **machine_info(engines[routes[0]].loaded.facts),
        "load_average_start": report.pop("_load_start"),
        "load_average_end": load_average(),
    }
    report["started_at"] = started_at.isoformat(timespec="seconds")
    report["duration_s"] = round(time.monotonic() - t0, 1)
    return floor.finish(report, args.json, started_at, print_report, sys.stdout, name="bench-dtypes")


def measure_routes(args, engines: dict, prompt_target: int, output: int, clients: int, repeats: int) -> dict:
    routes = list(engines)
    load_start = load_average()
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
        answers[route] = [outputs(_stepped(engine, [p], f"quality-{route}-{i}")[0])[0] for i, p in enumerate(quality)]
    rows = {route: _row(engines[route], runs[route], answers[route], answers[routes[0]]) for route in routes}
    beside = (first, quality, output, repeats, answers[routes[0]], DEFAULTS["quality_tokens"])
    llamacpp = anchor.llamacpp_beside(args, payloads[0], *beside)
    vllm = anchor.vllm_beside(args, payloads, *beside)
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
        "ratios": {
            **_ratios(rows, runs, routes, clients),
            **anchor.llamacpp_ratios(rows, llamacpp),
            **anchor.vllm_ratios(rows, vllm),
        },
        **({"anchor": llamacpp} if llamacpp is not None else {}),
        **({"vllm_anchor": vllm} if vllm is not None else {}),
    }


def _row(engine, runs: dict, answers: list, reference: list) -> dict:
    facts = engine.loaded.facts
    lone = [r["decode_tokens_per_s"] for r in runs["lone"] if r["decode_tokens_per_s"]]
    batched = [r["tokens_per_s"] for r in runs["batched"] if r["tokens_per_s"]]
    return {
        "facts": facts.to_dict(),
        "decoder": engine.decoder(),
        "compiled": engine.compiled(),  # the decode stretches compiled ahead of time, or why not
        "load_s": round(engine.loaded.load_s, 2),
        "tensor_kv_bytes_per_token": engine.pool.computed_bytes(1),  # computed from the pool tensor's layout
        "lone_decode_tokens_per_s": spread(lone),
        "prefill_ms": spread([r["prefill_ms"] for r in runs["lone"] if r["prefill_ms"] is not None]),
        "step_ms": spread([r["step_ms_median"] for r in runs["lone"] if r["step_ms_median"] is not None]),
        "typical_token_ms": spread([r["median_gap_ms"] for r in runs["lone"] if r.get("median_gap_ms") is not None]),
        "batched_tokens_per_s": spread(batched),
        "agreement": agreement(answers, reference),
        "runs": runs,
    }


def _ratios(rows: dict, runs: dict, routes: list[str], clients: int) -> dict:
    """Each route over the reference, repeat by repeat (the same turn of the same run), then the median; a
    `:compiled` route over its eager twin too, where the run has it."""
    report = {}
    twins = {r: r.removesuffix(f":{COMPILED}") for r in routes if compiled_route(r)}
    pairs = [(route, routes[0]) for route in routes[1:]]
    pairs += [(route, eager) for route, eager in twins.items() if eager in routes]
    for route, ref in pairs:
        lone_goal, batched_goal = goals_over(route, ref)
        for name, key, field_, goal, what in (
            ("lone", "lone", "decode_tokens_per_s", lone_goal, "lone client: decode tokens/s"),
            ("prefill", "lone", "prefill_ms", PREFILL_GOAL if lone_goal else None, "lone client: prefill time"),
            ("batched", "batched", "tokens_per_s", batched_goal, f"{clients} clients: aggregate tokens/s"),
        ):
            values = [
                a[field_] / b[field_] for a, b in zip(runs[route][key], runs[ref][key]) if a[field_] and b[field_]
            ]
            value = median(values) if values else None
            report[f"{name}_{route}_over_{ref}"] = judged(f"{what}, {route} / {ref}", spread(values), value, goal)
    return report


def goals_over(route: str, ref: str) -> tuple[tuple, tuple]:
    """The lone and batched targets of `route` over the reference: the native step's over transformers' when the
    two differ by their decoder only, none where they differ in compiled stretches only (no target: a ratio), else
    the quantized route's over float32's."""
    (dtype, decoder), (ref_dtype, ref_decoder) = split_route(route), split_route(ref)
    if (dtype, decoder) == (ref_dtype, ref_decoder):
        return None, None
    if dtype == ref_dtype and decoder != ref_decoder:
        return DECODER_LONE_GOAL, DECODER_BATCHED_GOAL
    return LONE_GOAL, BATCHED_GOAL


def _command(args, routes, prompt_target, output, clients, repeats) -> str:
    parts = ["kvscope bench", f"--dtypes {','.join(routes)}", f"--model {args.model}"]
    parts += [f"--device {args.device}"] if args.device != "auto" else []
    parts += [f"--prompt-lens {prompt_target}", f"--output-lens {output}", f"--concurrency {clients}"]
    parts += [f"--repeats {repeats}"]
    # the anchor is part of what ran: a run's command must say it to be run again as it was
    return " ".join(parts + ([f"--anchor {args.anchor}"] if getattr(args, "anchor", None) else []))


# ---- the table ---------------------------------------------------------------------------------


def print_report(report: dict, out: TextIO) -> None:
    s = report["settings"]
    what = f"{s['prompt_tokens']}-token prompt, {s['output_tokens']} new tokens, {s['clients']} clients batched"
    floor.print_head(f"\nkvscope bench --dtypes: {what}, {s['repeats']} repeats (order rotating), greedy", report, out)
    print(file=out)
    head = ("--dtype", "weights", "KV", "lone tok/s", "prefill ms", f"@{s['clients']} tok/s", "weights MB",
            "KV B/token", "load s", "identical")  # fmt: skip
    print("  ".join(f"{h:>12}" for h in head), file=out)
    for route, row in report["routes"].items():
        f, a = row["facts"], row["agreement"]
        cells = (
            route,
            f["weights_dtype"],
            f["kv_dtype"],
            fmt_num(row["lone_decode_tokens_per_s"]["median"]),
            fmt_num(row["prefill_ms"]["median"]),
            fmt_num(row["batched_tokens_per_s"]["median"]),
            fmt_num(f["weights_bytes"] / 1e6),
            f"{f['kv_bytes_per_token']:,}",
            fmt_num(row["load_s"], 2),
            f"{a['identical']}/{a['compared']}",
        )
        print("  ".join(f"{c:>12}" for c in cells), file=out)
    for route, row in report["routes"].items():
        f, decoder = row["facts"], row.get("decoder") or {}
        print(f"\n{route}: {f['dtype_reason'] or f['dtype_route']}; quantization: {f['quantization']}", file=out)
        if decoder:
            print(f"  decoder: {decoder['name']} ({decoder['reason']})", file=out)
        if (row.get("compiled") or {}).get("state") == "on":
            print(f"  compiled decode stretches: {row['compiled']['reason']}", file=out)
        a = row["agreement"]
        if a["first_diff"]:
            firsts = ", ".join(f"#{d['request']}@{d['token']}" for d in a["first_diff"])
            print(
                f"  vs the reference: {a['identical']}/{a['compared']} answers identical, "
                f"{a['tokens_before_divergence_share']:.0%} of tokens before the first difference; "
                f"first differences (prompt@token): {firsts}",
                file=out,
            )
    anchor.print_anchors(report, s["clients"], out)
    print("\nratios (median over repeats [min-max]) and the targets:", file=out)
    for r in report["ratios"].values():
        sp = r["spread"]
        verdict = floor.verdict_text(r, "-")
        target = f" (target {r['direction']} {r['target']}: {verdict})" if r["target"] is not None else ""
        print(
            f"  {r['what']}: {fmt_num(r['value'], 2)}x [{fmt_num(sp.get('min'), 2)}-{fmt_num(sp.get('max'), 2)}]{target}",
            file=out,
        )
