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
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from statistics import median
from typing import Any, TextIO

import torch

from model_runner.errors import UserError
from model_runner.loading.loader import DTYPE_CHOICES
from model_runner.local.config import DECODERS

from .clients import Job, RequestRecord, read_events, submit_job
from .machine import load_average, machine_info
from .prompts import fit_prompt
from .ratios import first_difference, greedy_equality, judged, outputs
from .stats import spread

DEFAULT_ROUTES = "float32,auto"
QUALITY_FILE = Path("data") / "quality_prompts.json"
DEFAULTS = {"prompt": 64, "output": 32, "clients": 8, "repeats": 3, "quality_tokens": 32}
LONE_GOAL = ("min", 2.5)  # the project's target: the default's lone decode tokens/s over float32's
BATCHED_GOAL = ("min", 1.5)  # aggregate tokens/s at 8 clients
PREFILL_GOAL = ("max", 1.0)  # prefill time no longer than float32's
ANCHOR_GOAL = ("min", 0.8)  # lone decode tokens/s over llama.cpp's on the same GGUF
# The native decoder step against transformers' on the same route: lone decode, and the batched clients (16).
DECODER_LONE_GOAL = ("min", 1.25)
DECODER_BATCHED_GOAL = ("min", 1.2)
NATIVE_ANCHOR_GOAL = ("min", 1.2)  # the native step's lone decode over llama.cpp's


def split_route(route: str) -> tuple[str, str]:
    """`dtype` or `dtype:decoder` → (dtype, decoder); the decoder defaults to auto."""
    dtype, _, decoder = route.partition(":")
    return dtype, decoder or "auto"


def parse_routes(text: str) -> list[str]:
    routes = [r.strip() for r in text.split(",") if r.strip()]
    bad = [r for r in routes if split_route(r)[0] not in DTYPE_CHOICES or split_route(r)[1] not in DECODERS]
    if bad or len(routes) < 2 or len(set(routes)) != len(routes):
        raise UserError(
            f"--dtypes takes two or more different values of {', '.join(DTYPE_CHOICES)}, comma-separated "
            f"(the first is the reference), each optionally with :{'|:'.join(DECODERS)} for its decoder, got {text!r}",
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
    same = sum(min(len(a), len(b)) if (first := first_difference(a, b)) is None else first for a, b in pairs)
    total = sum(len(b) for _, b in pairs)
    return {
        **eq,
        "identical_share": round(eq["identical"] / eq["compared"], 4) if eq["compared"] else None,
        "tokens_before_divergence_share": round(same / total, 4) if total else None,
    }


# ---- one run -----------------------------------------------------------------------------------


def _engine(args: argparse.Namespace, route: str, clients: int):
    """A loaded engine whose worker thread never starts: the bench's one thread runs every route's
    steps (run_stepped_all), so no route is helped or hurt by which thread torch runs on (two idle
    OpenMP teams beside a busy one cost the small int4/int8 steps most; docs/performance.md)."""
    from model_runner.loading.loader import load
    from model_runner.local.engine import Engine, EngineConfig

    dtype, decoder = split_route(route)
    config = EngineConfig(
        model=args.model, device=args.device, dtype=dtype, max_queue=max(64, clients), timeout_s=600.0, decoder=decoder
    )
    return Engine(config, loaded=load(args.model, args.device, dtype))


def run_stepped_all(engine, payloads: list[dict], prefix: str) -> tuple[list[RequestRecord], float]:
    """All the requests submitted at once, then this thread runs the engine's step() until every one
    has ended (readers take their events meanwhile); (records, first send -> last terminal event)."""
    records = [RequestRecord(f"{prefix}-{i}") for i in range(len(payloads))]
    handles = [submit_job(engine, Job(p), r, lambda: None) for p, r in zip(payloads, records)]
    readers = [
        threading.Thread(target=read_events, args=(h, Job(p), r), name="bench-reader", daemon=True)
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
    print_report(report, sys.stdout)
    path = args.json or f"bench-dtypes-{started_at.strftime('%Y%m%d-%H%M%S')}.json"
    with open(path, "w") as f:
        json.dump(report, f, indent=1, allow_nan=False)
    print(f"\nwrote {path}")
    return 0


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
        answers[route] = [
            outputs(run_stepped_all(engine, [p], f"quality-{route}-{i}")[0])[0] for i, p in enumerate(quality)
        ]
    rows = {route: _row(engines[route], runs[route], answers[route], answers[routes[0]]) for route in routes}
    anchor = _anchor(args, first, payloads[0], quality, output, repeats, answers[routes[0]])
    vllm = _vllm_anchor(args, first, payloads, quality, output, repeats, answers[routes[0]])
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
            **_anchor_ratios(rows, anchor),
            **_vllm_ratios(rows, vllm),
        },
        **({"anchor": anchor} if anchor is not None else {}),
        **({"vllm_anchor": vllm} if vllm is not None else {}),
    }


def _row(engine, runs: dict, answers: list, reference: list) -> dict:
    facts = engine.loaded.facts
    lone = [r["decode_tokens_per_s"] for r in runs["lone"] if r["decode_tokens_per_s"]]
    batched = [r["tokens_per_s"] for r in runs["batched"] if r["tokens_per_s"]]
    return {
        "facts": facts.to_dict(),
        "decoder": engine.decoder(),
        "load_s": round(engine.loaded.load_s, 2),
        "tensor_kv_bytes_per_token": engine.pool.computed_bytes(1),  # computed from the pool tensor's layout
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
        lone_goal, batched_goal = goals_over(route, ref)
        for name, key, field_, goal, what in (
            ("lone", "lone", "decode_tokens_per_s", lone_goal, "lone client: decode tokens/s"),
            ("prefill", "lone", "prefill_ms", PREFILL_GOAL, "lone client: prefill time"),
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
    two differ by their decoder only, else the quantized route's over float32's."""
    (dtype, decoder), (ref_dtype, ref_decoder) = split_route(route), split_route(ref)
    if dtype == ref_dtype and decoder != ref_decoder:
        return DECODER_LONE_GOAL, DECODER_BATCHED_GOAL
    return LONE_GOAL, BATCHED_GOAL


def _anchor(args, engine, lone: dict, quality: list[dict], output: int, repeats: int, reference: list):
    """llama.cpp on the bundled GGUF with the token ids the engine's chat template gives (None without
    --anchor); its greedy answers compared with the reference route's."""
    if not getattr(args, "anchor", None):
        return None
    from model_runner.loading.loader import find_default_gguf
    from model_runner.request import parse_generate
    from model_runner.text.prompt import plan

    from .anchor import run_anchor

    if args.model != "default":
        return {"available": False, "why": "the llama.cpp anchor runs the bundled GGUF only (--model default)"}
    window = engine.loaded.facts.context_window

    def ids(payload: dict) -> list[int]:
        return plan(engine.loaded.tokenizer, parse_generate(payload), window).ids

    print("  llama.cpp anchor: the lone prompt, then the quality prompts", file=sys.stderr, flush=True)
    tokens = DEFAULTS["quality_tokens"]
    result = run_anchor(find_default_gguf(), ids(lone), repeats, [ids(q) for q in quality], output, tokens,
                        torch.get_num_threads())  # fmt: skip
    if result["available"]:
        result["lone_decode_tokens_per_s"] = spread([v for v in result["lone_decode_tokens_per_s"] if v])
        result["prefill_ms"] = spread([v for v in result["prefill_ms"] if v is not None])
        result["agreement"] = agreement(result.pop("quality_answers"), reference)
    return result


def _anchor_ratios(rows: dict, anchor: dict | None) -> dict:
    """Each route's median lone decode tokens/s over llama.cpp's (separate turns of one run, so medians)."""
    if not anchor or not anchor.get("available"):
        return {}
    theirs = anchor["lone_decode_tokens_per_s"]["median"]
    report = {}
    for route, row in rows.items():
        ours = row["lone_decode_tokens_per_s"]["median"]
        value = ours / theirs if ours and theirs else None
        native = (row.get("decoder") or {}).get("name") == "native"
        report[f"lone_{route}_over_llamacpp"] = judged(
            f"lone client: decode tokens/s, {route} / llama.cpp (medians)", spread([value] if value else []), value,
            NATIVE_ANCHOR_GOAL if native else ANCHOR_GOAL,
        )  # fmt: skip
    return report


def _vllm_anchor(args, engine, payloads: list[dict], quality: list[dict], output: int, repeats: int, reference):
    """vLLM's CPU build on the same weights and token ids (None without --anchor vllm); run after every
    engine turn, as its idle worker would take a core from them."""
    if getattr(args, "anchor", None) != "vllm":
        return None
    from model_runner.request import parse_generate
    from model_runner.text.prompt import plan

    from .anchor import run_vllm_anchor

    if args.model != "default":
        return {"available": False, "why": "the vLLM anchor serves the bundled model only (--model default)"}
    window, tokenizer = engine.loaded.facts.context_window, engine.loaded.tokenizer

    def ids(payload: dict) -> list[int]:
        return plan(tokenizer, parse_generate(payload), window).ids

    print("  vLLM anchor: starting vLLM (minutes), then the lone prompt, the batch, the quality prompts", file=sys.stderr,
          flush=True)  # fmt: skip
    log_path = Path(args.json or "bench-dtypes").with_suffix(".vllm.log")
    result = run_vllm_anchor(ids(payloads[0]), [ids(p) for p in payloads], repeats, [ids(q) for q in quality], output,
                             DEFAULTS["quality_tokens"], log_path)  # fmt: skip
    if result["available"]:
        for key in ("lone_decode_tokens_per_s", "prefill_ms", "batched_tokens_per_s"):
            result[key] = spread([v for v in result[key] if v is not None])
        result["agreement"] = agreement(result.pop("quality_answers"), reference)
    return result


def _vllm_ratios(rows: dict, vllm: dict | None) -> dict:
    """Each route's medians over vLLM's (separate turns of one run): lone decode, prefill, N clients."""
    if not vllm or not vllm.get("available"):
        return {}
    report = {}
    for route, row in rows.items():
        for name, ours, theirs, what in (
            ("lone", "lone_decode_tokens_per_s", "lone_decode_tokens_per_s", "lone client: decode tokens/s"),
            ("prefill", "prefill_ms", "prefill_ms", "lone client: prefill time"),
            ("batched", "batched_tokens_per_s", "batched_tokens_per_s", "clients: aggregate tokens/s"),
        ):
            a, b = row[ours]["median"], vllm[theirs]["median"]
            value = a / b if a and b else None
            report[f"{name}_{route}_over_vllm"] = judged(
                f"{what}, {route} / vLLM CPU (medians)", spread([value] if value else []), value, None
            )
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
        f, decoder = row["facts"], row.get("decoder") or {}
        print(f"\n{route}: {f['dtype_reason'] or f['dtype_route']}; quantization: {f['quantization']}", file=out)
        if decoder:
            print(f"  decoder: {decoder['name']} ({decoder['reason']})", file=out)
        a = row["agreement"]
        if a["first_diff"]:
            firsts = ", ".join(f"#{d['request']}@{d['token']}" for d in a["first_diff"])
            print(
                f"  vs the reference: {a['identical']}/{a['compared']} answers identical, "
                f"{a['tokens_before_divergence_share']:.0%} of tokens before the first difference; "
                f"first differences (prompt@token): {firsts}",
                file=out,
            )
    _print_anchor(report.get("anchor"), out)
    _print_vllm(report.get("vllm_anchor"), s["clients"], out)
    print("\nratios (median over repeats [min-max]) and the targets:", file=out)
    for r in report["ratios"].values():
        sp = r["spread"]
        verdict = {True: "met", False: "MISSED", None: "-"}[r["met"]]
        target = f" (target {r['direction']} {r['target']}: {verdict})" if r["target"] is not None else ""
        print(f"  {r['what']}: {_f(r['value'], 2)}x [{_f(sp.get('min'), 2)}-{_f(sp.get('max'), 2)}]{target}", file=out)


def _print_anchor(anchor: dict | None, out: TextIO) -> None:
    if anchor is None:
        return
    if not anchor["available"]:
        print(f"\nllama.cpp anchor: not run: {anchor['why']}", file=out)
        return
    a = anchor["agreement"]
    print(
        f"\nllama.cpp anchor ({anchor['engine']}, {anchor['threads']} threads, same GGUF and token ids): lone decode "
        f"{_f(anchor['lone_decode_tokens_per_s']['median'])} tok/s, prefill {_f(anchor['prefill_ms']['median'])} ms; "
        f"{a['identical']}/{a['compared']} quality answers identical to the reference route's",
        file=out,
    )


def _print_vllm(vllm: dict | None, clients: int, out: TextIO) -> None:
    if vllm is None:
        return
    if not vllm["available"]:
        print(f"\nvLLM anchor: not run: {vllm['why']}", file=out)
        return
    a = vllm["agreement"]
    print(
        f"\nvLLM anchor ({vllm['engine']}, worker on {vllm['threads'] or '?'} core(s), same weights and token ids, "
        f"alone on the machine): lone decode {_f(vllm['lone_decode_tokens_per_s']['median'])} tok/s, prefill "
        f"{_f(vllm['prefill_ms']['median'])} ms, {clients} clients {_f(vllm['batched_tokens_per_s']['median'])} tok/s; "
        f"{a['identical']}/{a['compared']} quality answers identical to the reference route's; "
        f"ready after {vllm['ready_s']:.0f} s; {vllm['capacity'] or 'no capacity line'}",
        file=out,
    )
