"""`kvscope bench`'s command line, and the run of its default benchmark, the grid (grid.py): open the target,
fit prompts, measure, assemble the report that grid_report.py prints and writes as JSON passing grid.SCHEMA;
`--dtypes`/`--anchor`, `--batch-invariant`, `--structured`, and `--batching`/`--class` hand the run to their own modules."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone

from model_runner.local.config import DECODERS
from model_runner.protocol.errors import UserError
from model_runner.protocol.request import LIMITS

from .grid import CACHE_OFF_TOKENS, FULL, QUICK, QUICK_NOTE, Bench, Grid, cells_of
from .grid_report import finish, ratio_report
from .measure import Progress, Prompt, fit_prompt, load_average, machine_info, open_target, work
from .report import DEFINITIONS, totals

DTYPE_HELP = "auto, float32, bfloat16, float16, int4 or int8 (see kvscope serve)"


# ---- command line ------------------------------------------------------------------------------


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def add_parser(subparsers) -> None:
    b = subparsers.add_parser(
        "bench",
        help="measure queue, TTFT, TPOT, ITL and E2E against a bare loop and generate()",
        description="Benchmark the engine like a serving benchmark: a grid of prompt lengths x output lengths x "
        "concurrent clients, repeated, with baselines interleaved on the same model.",
    )
    b.add_argument(
        "--model",
        default="default",
        help="'default' (bundled SmolLM2-135M-Instruct), 'fake', or a "
        "transformers folder / cached hub id; with --via-websocket, the model the server runs",
    )
    for flag, choices in (("--device", "auto, cuda, mps or cpu"), ("--dtype", DTYPE_HELP)):
        b.add_argument(flag, default="auto", help=choices)
    b.add_argument(
        "--decoder",
        choices=DECODERS,
        default="auto",
        help="the in-process engine's decoder: auto, native or transformers (see kvscope serve; to compare two in "
        "one run: --dtypes auto:transformers,auto:native)",
    )
    b.add_argument(
        "--dtypes",
        nargs="?",
        const="float32,auto",
        metavar="LIST",
        help="compare dtype routes in one run (default float32,auto; the first is the reference): lone-client "
        "decode tokens/s, prefill, aggregate tokens/s at --concurrency (default 8) clients, memory, and greedy "
        "agreement on the quality prompts, with ratios (target: auto >= 2.5x float32 alone); a route may name its "
        "decoder (auto:native) and then :compiled for its decode stretches compiled ahead of time (auto:native:compiled, "
        "set beside its eager twin too)",
    )
    b.add_argument(
        "--anchor",
        choices=["llamacpp", "vllm"],
        help="with the --dtypes comparison (implied), run llama.cpp on the same GGUF and token ids in the same run "
        "(node-llama-cpp 3.21.1's prebuilt CPU binaries, or llama-cpp-python); vllm: llama.cpp, then vLLM's CPU "
        "build (make test-vllm installs it) after the engine's turns; says so plainly when one is missing",
    )
    b.add_argument(
        "--quick", action="store_true", help=f"a small grid that ends in under 3 minutes on 2 CPU cores ({QUICK_NOTE})"
    )
    b.add_argument(
        "--prompt-lens", type=_int_list, help=f"prompt tokens, comma-separated (default {_join(FULL.prompt_lens)})"
    )
    b.add_argument(
        "--output-lens", type=_int_list, help=f"max new tokens, comma-separated (default {_join(FULL.output_lens)})"
    )
    b.add_argument(
        "--concurrency", type=_int_list, help=f"concurrent clients, comma-separated (default {_join(FULL.concurrency)})"
    )
    b.add_argument("--repeats", type=int, help=f"repetitions of each cell (default {FULL.repeats})")
    b.add_argument(
        "--via-websocket",
        metavar="URL",
        help="drive a running `kvscope serve` through its /ws protocol "
        "(e.g. ws://127.0.0.1:8000/ws) instead of an in-process engine",
    )
    b.add_argument(
        "--timeout",
        type=float,
        help="per-request timeout_s sent with each request (default: the "
        "server's limit; in-process the engine's limit is 600 s)",
    )
    b.add_argument("--no-baselines", action="store_true", help="skip the bare loop and generate() baselines")
    b.add_argument("--no-cache-probe", action="store_true", help="skip the kv_cache=false probe")
    b.add_argument("--json", metavar="PATH", help="where to write the results (default bench-YYYYMMDD-HHMMSS.json)")
    b.add_argument("--plot", metavar="PNG", help="draw TTFT vs prompt length and ITL distributions (needs matplotlib)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    b.add_argument(
        "--kv-cache-mb",
        type=float,
        help="the in-process engine's KV pool in MiB (default: one context window); small pools show preemptions",
    )
    c = b.add_argument_group("continuous batching (instead of the grid; in-process, see docs/performance.md)")
    c.add_argument(
        "--batching",
        action="store_true",
        help="aggregate tokens/s of --concurrency clients (default "
        "8,16) batched vs the same requests one at a time (max_num_seqs=1) vs transformers' "
        "generate_batch, greedy equality, and a lone client's step vs the bare loop; one --prompt-lens "
        "(default 64) and --output-lens (default 32), --repeats (default 1)",
    )
    c.add_argument(
        "--class",
        dest="class_scenario",
        action="store_true",
        help="the class scenario: 16 clients, "
        "mixed short/long prompts and answers, all at once and with seeded random arrivals, batched vs "
        "one at a time: TTFT/TPOT/ITL p50/p95/p99, preemptions, prefix-cache hits, failures",
    )
    c.add_argument("--seed", type=int, default=0, help="the class scenario's mix order and arrival times (default 0)")
    c.add_argument(
        "--arrival-s",
        type=float,
        default=4.0,
        help="the class scenario's arrivals spread over this many seconds (default 4)",
    )
    b.add_argument(
        "--batch-invariant",
        action="store_true",
        help="instead of the grid: what batch-invariant mode costs, in one in-process run: a lone client and "
        "--concurrency clients (default 8), --output-lens tokens (default 32), default mode then the mode "
        "(bench/invariance.py)",
    )
    b.add_argument(
        "--structured",
        action="store_true",
        help="instead of the grid: what a structured-output mask costs a decode step, in one in-process run: the "
        "same greedy requests plain and constrained (a JSON schema, a choice), interleaved, alone and at "
        "--concurrency (default 4) clients, --repeats (default 3); the step ratio and xgrammar's compile times "
        "(bench/structured.py)",
    )
    b.set_defaults(func=run_bench)


def _join(values) -> str:
    return ",".join(str(v) for v in values)


def grid_from(args: argparse.Namespace) -> Grid:
    base = QUICK if args.quick else FULL
    grid = Grid(
        args.prompt_lens or base.prompt_lens,
        args.output_lens or base.output_lens,
        args.concurrency or base.concurrency,
        args.repeats or base.repeats,
    )
    if grid.repeats < 1:
        raise UserError("--repeats must be at least 1", field="repeats")
    if args.timeout is not None and not 0 < args.timeout <= LIMITS["timeout_s"]:
        raise UserError(f"--timeout must be in (0, {LIMITS['timeout_s']:g}] seconds", field="timeout")
    return grid


def command_line(args: argparse.Namespace, grid: Grid) -> str:
    parts = ["kvscope bench", f"--model {args.model}"]
    parts += [f"--device {args.device}"] if args.device != "auto" else []
    parts += [f"--dtype {args.dtype}"] if args.dtype != "auto" else []
    parts += ["--quick"] if args.quick else []
    parts += [
        f"--prompt-lens {_join(grid.prompt_lens)}",
        f"--output-lens {_join(grid.output_lens)}",
        f"--concurrency {_join(grid.concurrency)}",
        f"--repeats {grid.repeats}",
    ]
    parts += [f"--via-websocket {args.via_websocket}"] if args.via_websocket else []
    parts += [f"--timeout {args.timeout:g}"] if args.timeout else []
    parts += ["--no-baselines"] if args.no_baselines else []
    parts += ["--no-cache-probe"] if args.no_cache_probe else []
    parts += [f"--kv-cache-mb {args.kv_cache_mb:g}"] if getattr(args, "kv_cache_mb", None) else []
    return " ".join(parts)


# ---- one run -----------------------------------------------------------------------------------


def run_bench(args: argparse.Namespace) -> int:
    if getattr(args, "dtypes", None) or getattr(args, "anchor", None):
        from .dtypes import run_dtypes

        return run_dtypes(args)
    if getattr(args, "batch_invariant", False):
        from .invariance import run_invariance

        return run_invariance(args)
    if getattr(args, "structured", False):
        from .structured import run_structured

        return run_structured(args)
    if getattr(args, "batching", False) or getattr(args, "class_scenario", False):
        from .batching import run_batching

        return run_batching(args)
    grid = grid_from(args)
    started_at, t0 = datetime.now(timezone.utc), time.monotonic()
    print(
        f"kvscope bench: loading {args.model} ({'over ' + args.via_websocket if args.via_websocket else 'in-process'})",
        file=sys.stderr,
        flush=True,
    )
    target = open_target(args, max(grid.concurrency))
    bench = Bench(args, target, grid)
    try:
        report = measure_grid(bench, started_at, t0)
    finally:
        bench.close()
        target.close()
    return finish(report, args, started_at)


def fit_prompts(bench: Bench) -> dict[int, Prompt]:
    """A prompt per target length; every prompt + output length must fit the context window."""
    facts, prompts = bench.facts, {}
    for p in bench.grid.prompt_lens:
        prompts[p] = prompt = fit_prompt(bench.target.describe, p)
        longest = prompt.tokens + max(bench.grid.output_lens)
        if longest > facts.context_window:
            raise UserError(
                f"prompt {prompt.tokens} + output {max(bench.grid.output_lens)} tokens exceeds "
                f"{facts.name}'s context window of {facts.context_window}; choose smaller "
                "--prompt-lens or --output-lens",
                field="prompt_lens",
            )
        if prompt.tokens != p:
            bench.notes.append(f"prompt target {p} tokens: the closest deterministic prompt has {prompt.tokens}")
    return prompts


def measure_grid(bench: Bench, started_at: datetime, t0: float) -> dict:
    """The whole run: ceilings, warm-up, the grid, the no-cache probe; returns the report."""
    args, grid = bench.args, bench.grid
    machine = machine_info(bench.facts)
    prompts = fit_prompts(bench)
    probe_prompt = prompts[grid.prompt_lens[0]]
    total = sum(
        work(prompts[c.prompt].tokens, c.output) * c.repeats * (c.clients + len(bench.runners(c)) - 1)
        for c in cells_of(grid, args.quick, bench.baselines)
    )
    total += 0 if args.no_cache_probe else work(probe_prompt.tokens, CACHE_OFF_TOKENS[args.quick]) * 6
    progress = Progress(total, enabled=not args.no_progress)
    progress.step("measuring the machine: memory copy and matmul", 0)
    bench.measure_ceilings()
    progress.step("warming up", 0)
    bench.warm_up(probe_prompt)
    cells, comparisons, records = bench.run(prompts, progress)
    probe = None
    if not args.no_cache_probe:
        probe, probe_records = bench.cache_off_probe(probe_prompt, progress)
        records += probe_records
    progress.step("measuring the machine again", 0)
    bench.measure_ceilings()
    progress.close()
    bench.apply_ceilings(cells, comparisons)
    if comparisons:
        bench.notes.append(
            "where the baselines ran, the engine they were compared with ran its own step() on "
            "their thread, its worker thread never started (same code per token, same torch "
            "thread); the other cells used "
            + ("the server" if bench.target.mode == "websocket" else "the engine's worker thread")
        )
    if bench.generate_skip:
        bench.notes.append(f"generate+streamer baseline skipped: {bench.generate_skip}")
    machine["load_average_end"] = load_average()
    ok = [r for r in records if r.outcome == "completed"]
    delivery = ([x for r in ok for x in r.delivery_ms], [x for r in ok for x in r.delivery_lower_ms])
    return {
        "kind": "kvscope-bench",
        "version": 1,
        "mode": bench.target.mode,
        "url": args.via_websocket,
        "started_at": started_at.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - t0, 1),
        "command": command_line(args, grid),
        "machine": machine,
        "model": bench.facts.to_dict(),
        "settings": {
            "prompt_lens": list(grid.prompt_lens),
            "output_lens": list(grid.output_lens),
            "concurrency": list(grid.concurrency),
            "repeats": grid.repeats,
            "quick": args.quick,
            "baselines": bench.baselines,
            "timeout_s": args.timeout,
            "sampling": "greedy",
        },
        "definitions": DEFINITIONS,
        "ceilings": bench.ceilings,
        "cells": cells,
        "comparisons": comparisons,
        "ratios": ratio_report(comparisons, cells, delivery, bench.target.mode),
        "kv_cache_off": probe,
        "totals": totals(records),
        "notes": bench.notes,
    }
