"""`kvscope bench`: a serving benchmark of the engine, in-process or over the real WebSocket, across
prompt lengths x output lengths x concurrent clients, repeated, with the bare greedy loop and
transformers generate+streamer interleaved as baselines on the same model, and the machine's
ceilings; prints the tables and ratios, writes JSON that passes stats.SCHEMA."""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable

from . import baselines as bl
from .clients import InProcessClient, Job, RequestRecord, WebSocketClient, run_jobs, run_stepped
from .stats import DEFINITIONS, METRICS, describe, percentile, spread
from model_runner.errors import UserError
from model_runner.request import LIMITS, parse_generate


@dataclass(frozen=True)
class Grid:
    prompt_lens: tuple[int, ...]
    output_lens: tuple[int, ...]
    concurrency: tuple[int, ...]
    repeats: int


FULL = Grid(prompt_lens=(32, 128, 512, 2048), output_lens=(16, 64, 256), concurrency=(1, 2, 4), repeats=3)
QUICK = Grid(prompt_lens=(64, 1024), output_lens=(24,), concurrency=(1, 2), repeats=4)
QUICK_NOTE = "the short prompt repeats, with baselines; concurrency 2 and the long prompt run once each"
CACHE_OFF_TOKENS = {False: 24, True: 16}  # the no-cache probe's tokens (by --quick): enough to see steps grow
TARGETS = {  # benchmark targets from the issue; reported as met or missed, never asserted
    "engine_step_over_bare": ("max", 1.03),
    "engine_tps_over_generate": ("min", 1.10),
    "delivery_p95_ms": ("max", 30.0),
}

# Deterministic prompt text (kvscope's own words): an instruction that invites a long answer, then
# notes cycled as needed. A prompt of N tokens is the longest prefix of this that fits in N.
INSTRUCTION = "Write a long, detailed essay that explains the following notes, point by point."
NOTES = (
    "A language model reads the whole prompt in one pass, called prefill, and stores a key and a value "
    "for every token in every layer. Then it writes the answer one token at a time; each new token "
    "attends to everything stored so far, so the cache grows by one position per step. Prefill is limited "
    "by arithmetic, because many tokens share each weight read, while decoding is limited by memory, "
    "because every step reads all the weights to produce a single token. Queues form when more people "
    "ask than the model can serve, and the waiting shows up as time to first token. Streaming sends each "
    "piece of text as soon as it is ready, so a reader sees progress long before the answer is complete."
).split()


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
        "bench", help="measure queue, TTFT, TPOT, ITL and E2E against a bare loop and generate()",
        description="Benchmark the engine like a serving benchmark: a grid of prompt lengths x output lengths x "
                    "concurrent clients, repeated, with baselines interleaved on the same model.")
    b.add_argument("--model", default="default", help="'default' (bundled SmolLM2-135M-Instruct), 'fake', or a "
                   "transformers folder / cached hub id; with --via-websocket, the model the server runs")
    b.add_argument("--device", default="auto", help="auto, cuda, mps or cpu")
    b.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    b.add_argument("--quick", action="store_true", help=f"a small grid that ends in under 3 minutes on 2 CPU cores ({QUICK_NOTE})")
    b.add_argument("--prompt-lens", type=_int_list, help=f"prompt tokens, comma-separated (default {_join(FULL.prompt_lens)})")
    b.add_argument("--output-lens", type=_int_list, help=f"max new tokens, comma-separated (default {_join(FULL.output_lens)})")
    b.add_argument("--concurrency", type=_int_list, help=f"concurrent clients, comma-separated (default {_join(FULL.concurrency)})")
    b.add_argument("--repeats", type=int, help=f"repetitions of each cell (default {FULL.repeats})")
    b.add_argument("--via-websocket", metavar="URL", help="drive a running `kvscope serve` through its /ws protocol "
                   "(e.g. ws://127.0.0.1:8000/ws) instead of an in-process engine")
    b.add_argument("--timeout", type=float, help="per-request timeout_s sent with each request (default: the "
                   "server's limit; in-process the engine's limit is 600 s)")
    b.add_argument("--no-baselines", action="store_true", help="skip the bare loop and generate() baselines")
    b.add_argument("--no-cache-probe", action="store_true", help="skip the kv_cache=false probe")
    b.add_argument("--json", metavar="PATH", help="where to write the results (default bench-YYYYMMDD-HHMMSS.json)")
    b.add_argument("--plot", metavar="PNG", help="draw TTFT vs prompt length and ITL distributions (needs matplotlib)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    b.set_defaults(func=run_bench)


def _join(values) -> str:
    return ",".join(str(v) for v in values)


def grid_from(args: argparse.Namespace) -> Grid:
    base = QUICK if args.quick else FULL
    grid = Grid(args.prompt_lens or base.prompt_lens, args.output_lens or base.output_lens,
                args.concurrency or base.concurrency, args.repeats or base.repeats)
    if grid.repeats < 1:
        raise UserError("--repeats must be at least 1", field="repeats")
    if args.timeout is not None and not 0 < args.timeout <= LIMITS["timeout_s"]:
        raise UserError(f"--timeout must be in (0, {LIMITS['timeout_s']:g}] seconds", field="timeout")
    return grid


@dataclass(frozen=True)
class Cell:
    prompt: int
    output: int
    clients: int
    repeats: int
    baselines: bool  # run the bare loop and generate() beside the engine in each repetition


def cells_of(grid: Grid, quick: bool, baselines: bool) -> list[Cell]:
    """The grid's cells. Baselines run wherever there is one client. --quick keeps the repeats and
    the baselines to the shortest prompt with one client (where the ratios come from), runs its
    other concurrencies once, and runs the longer prompts once with one client: enough to show
    each trend in under 3 minutes on 2 cores."""
    cells = []
    for p, o, c in itertools.product(grid.prompt_lens, grid.output_lens, grid.concurrency):
        first = p == grid.prompt_lens[0]
        if quick and not first and c > 1:
            continue
        main = c == 1 and (first or not quick)
        cells.append(Cell(p, o, c, grid.repeats if main or not quick else 1, baselines and main))
    return cells


def command_line(args: argparse.Namespace, grid: Grid) -> str:
    parts = ["kvscope bench", f"--model {args.model}"]
    parts += [f"--device {args.device}"] if args.device != "auto" else []
    parts += [f"--dtype {args.dtype}"] if args.dtype != "auto" else []
    parts += ["--quick"] if args.quick else []
    parts += [f"--prompt-lens {_join(grid.prompt_lens)}", f"--output-lens {_join(grid.output_lens)}",
              f"--concurrency {_join(grid.concurrency)}", f"--repeats {grid.repeats}"]
    parts += [f"--via-websocket {args.via_websocket}"] if args.via_websocket else []
    parts += [f"--timeout {args.timeout:g}"] if args.timeout else []
    parts += ["--no-baselines"] if args.no_baselines else []
    parts += ["--no-cache-probe"] if args.no_cache_probe else []
    return " ".join(parts)


# ---- the thing under test ----------------------------------------------------------------------

@dataclass
class Target:
    """The engine as the bench reaches it, and the model object the baselines run on."""
    mode: str
    client: Any
    loaded: Any  # LoadedModel: model, tokenizer adapter, facts
    describe: Callable[[Any], dict]  # GenerateParams -> describe_prompt's dict
    close: Callable[[], None]
    notes: list[str] = field(default_factory=list)


def open_target(args: argparse.Namespace, max_clients: int) -> Target:
    if args.via_websocket:
        return _websocket_target(args)
    from model_runner.engine import Engine, EngineConfig
    engine = Engine(EngineConfig(model=args.model, device=args.device, dtype=args.dtype,
                                 max_queue=max(64, max_clients), timeout_s=600.0)).start()
    try:
        engine.wait_ready(900)
    except RuntimeError as exc:
        engine.shutdown()
        raise UserError(f"the model did not load: {exc}", code="model_failed", field="model") from None
    return Target("in-process", InProcessClient(engine), engine.loaded, engine.describe_prompt, engine.shutdown)


def _websocket_target(args: argparse.Namespace) -> Target:
    """The server runs the engine; this process loads the same model for prompts and baselines."""
    import urllib.request
    from urllib.parse import urlsplit
    from model_runner.loader import load
    from model_runner.prompt import plan
    parts = urlsplit(args.via_websocket)
    if parts.scheme not in ("ws", "wss") or not parts.netloc:
        raise UserError(f"--via-websocket must be a ws:// or wss:// URL, got {args.via_websocket!r}", field="via_websocket")
    http = f"{'https' if parts.scheme == 'wss' else 'http'}://{parts.netloc}/api/model"
    try:
        with urllib.request.urlopen(http, timeout=10) as response:
            server = json.load(response)
    except OSError as exc:
        raise UserError(f"--via-websocket: cannot reach {http} ({exc}); is `kvscope serve` running?",
                        field="via_websocket") from None
    if server.get("status") != "ready":
        raise UserError(f"--via-websocket: the server's model is {server.get('status')}; try again when it is ready",
                        code="model_loading", field="via_websocket")
    loaded = load(args.model, args.device, args.dtype)
    target = Target("websocket", WebSocketClient(args.via_websocket), loaded,
                    lambda params: plan(loaded.tokenizer, params, loaded.facts.context_window).to_dict(), lambda: None)
    served = (server.get("facts") or {}).get("name")
    if served != loaded.facts.name:
        target.notes.append(f"the server runs {served!r} but the baselines ran {loaded.facts.name!r}: pass the "
                            "server's model with --model")
    target.notes.append("over the WebSocket the baselines ran in the bench process, on its own copy of the same "
                        "weights, while the server sat idle")
    return target


# ---- prompts of a given length -----------------------------------------------------------------

@dataclass(frozen=True)
class Prompt:
    target: int
    messages: list[dict[str, str]]
    ids: list[int]

    @property
    def tokens(self) -> int:
        return len(self.ids)


def prompt_text(words: int) -> str:
    """The first `words` words of the instruction followed by the notes, cycled."""
    pool = INSTRUCTION.split() + [NOTES[i % len(NOTES)] for i in range(max(0, words))]
    return " ".join(pool[:max(1, words)])


def fit_prompt(describe: Callable[[Any], dict], target: int) -> Prompt:
    """The longest prompt (template included) of at most `target` tokens; the shortest one when even
    one word is over. Binary search over the word count: tokens only grow as words are added."""
    def tokens(words: int) -> tuple[int, list[int]] | None:
        messages = [{"role": "user", "content": prompt_text(words)}]
        try:
            view = describe(parse_generate({"messages": messages, "max_new_tokens": 1}))
        except UserError:  # longer than the content limit or the context window
            return None
        return view["counts"]["total"], [t["id"] for t in view["tokens"]]

    low, high = 1, 2
    while (count := tokens(high)) is not None and count[0] <= target:
        low, high = high, high * 2
    while high - low > 1:  # invariant: low fits (or is the minimum), high does not
        mid = (low + high) // 2
        count = tokens(mid)
        low, high = (mid, high) if count is not None and count[0] <= target else (low, mid)
    fitted = tokens(low)
    if fitted is None:
        raise UserError("not even a one-word prompt fits this model's context window", field="prompt_lens")
    return Prompt(target, [{"role": "user", "content": prompt_text(low)}], fitted[1])


# ---- one benchmark run -------------------------------------------------------------------------

class Progress:
    """A one-line progress bar on stderr (a line per step when stderr is not a terminal), with an
    ETA from the work done so far; work is weighted by tokens to process."""

    def __init__(self, total: float, enabled: bool = True, stream=None):
        self.total, self.done, self.enabled = max(total, 1e-9), 0.0, enabled
        self.stream = stream or sys.stderr
        self.started = time.monotonic()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def step(self, label: str, weight: float) -> None:
        if self.enabled:
            elapsed = time.monotonic() - self.started
            eta = f"{elapsed * (self.total - self.done) / self.done:4.0f}s left" if self.done else "   ? left"
            filled = int(24 * self.done / self.total)
            line = f"[{'#' * filled}{'.' * (24 - filled)}] {100 * self.done / self.total:3.0f}% {eta}  {label}"
            self.stream.write(f"\r{line:<110}" if self.tty else line + "\n")
            self.stream.flush()
        self.done += weight

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\r" + " " * 110 + "\r")
            self.stream.flush()


def work(prompt: int, output: int) -> float:
    """Relative cost of one generation, for the ETA: on 2 CPU cores a prefill token cost about a
    fifteenth of a decode step."""
    return prompt / 15 + output


class Bench:
    def __init__(self, args: argparse.Namespace, target: Target, grid: Grid):
        self.args, self.target, self.grid = args, target, grid
        self.model = target.loaded.model
        self.facts = target.loaded.facts
        self.shape = bl.Shape.of(self.facts, self.model.config)
        self.eos = target.loaded.tokenizer.eos_ids
        self.hf_tokenizer = getattr(target.loaded.tokenizer, "tok", None)
        self.baselines = not args.no_baselines
        self.generate_skip = bl.generate_streamer_unavailable(self.model, self.hf_tokenizer) if self.baselines else None
        self.notes: list[str] = list(target.notes)
        self.ceilings: dict[str, Any] = {}
        # The comparisons run all their model work on one thread: on a busy 2-core machine the same
        # torch loop measured up to 3x slower on one thread than on another (see docs/performance.md),
        # which would swamp a 3 % target. So the engine compared with the baselines is a second
        # Engine on the same model object, its worker never started, stepped on this thread.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-baseline")
        self.stepped = None
        if self.baselines:
            from model_runner.engine import Engine, EngineConfig
            self.stepped = Engine(EngineConfig(model=args.model, timeout_s=600.0), loaded=target.loaded)

    def on_thread(self, fn: Callable, *args):
        return self._thread.submit(fn, *args).result()

    def close(self) -> None:
        self._thread.shutdown(wait=True)

    def payload(self, prompt: Prompt, output: int, **extra) -> dict:
        payload = {"messages": prompt.messages, "max_new_tokens": output, **extra}
        if self.args.timeout:
            payload["timeout_s"] = self.args.timeout
        return payload

    def measure_ceilings(self) -> None:
        """Called before and after the grid; the best of the two stands, since on a shared machine a
        ceiling measured while others were busy would make every fraction look better than it is."""
        import torch
        device = torch.device(self.facts.device)
        copy = self.on_thread(bl.copy_bandwidth, device)
        matmul = self.on_thread(bl.matmul_rate, device, getattr(torch, self.facts.dtype))
        if self.ceilings:
            copy = max(copy, self.ceilings["copy"], key=lambda m: m["gb_per_s"])
            matmul = max(matmul, self.ceilings["matmul"], key=lambda m: m["gflop_per_s"])
        self.ceilings = {"copy_gb_per_s": copy["gb_per_s"], "matmul_gflop_per_s": matmul["gflop_per_s"],
                         "copy": copy, "matmul": matmul}

    def warm_up(self, prompt: Prompt) -> None:
        """One short run of each, untimed: first calls pay for allocation and lazy imports."""
        records, _ = run_jobs(self.target.client, [Job(self.payload(prompt, 4))], "warmup")
        if records[0].outcome != "completed":
            raise UserError(f"the warm-up request did not complete ({records[0].outcome}: {records[0].reason} "
                            f"{records[0].message or ''}); nothing to measure", code="bench_failed")
        if self.baselines:
            self.on_thread(run_stepped, self.stepped, Job(self.payload(prompt, 4)), "warmup-stepped")
            self.on_thread(bl.bare_greedy_loop, self.model, prompt.ids, 4, self.eos)
            if self.generate_skip is None:
                self.on_thread(bl.generate_with_streamer, self.model, self.hf_tokenizer, prompt.messages, 4, self.eos)

    def run(self, prompts: dict[int, Prompt], progress: Progress) -> tuple[list[dict], list[dict], list[RequestRecord]]:
        """Every cell, repeated; at one client the baselines run in the same repetition, in an order
        that rotates so none always runs first. Returns (cells, comparisons, every record)."""
        cells, comparisons, everything = [], [], []
        for cell in cells_of(self.grid, self.args.quick, self.baselines):
            prompt, o, c, records, walls = prompts[cell.prompt], cell.output, cell.clients, [], []
            runners = self.runners(cell)
            for rep in range(cell.repeats):
                order = runners[rep % len(runners):] + runners[:rep % len(runners)]
                results: dict[str, Any] = {}
                for name in order:
                    progress.step(f"prompt {prompt.tokens} out {o} x{c} rep {rep + 1}/{cell.repeats}: {name}",
                                  work(prompt.tokens, o) * (c if name in ("engine", "socket") else 1))
                    results[name] = self.run_one(name, prompt, o, c, f"p{cell.prompt}-o{o}-c{c}-r{rep}", cell.baselines)
                recs, wall = results["socket" if "socket" in results else "engine"]
                records += recs
                walls.append(wall)
                if cell.baselines:
                    comparisons.append(self.compare(prompt, o, rep, order, results["engine"][0][0], results))
                if "socket" in results:  # the stepped engine's request counts in the totals too
                    everything += results["engine"][0]
            cells.append(self.cell(prompt, o, c, cell.repeats, records, walls))
            everything += records
        return cells, comparisons, everything

    def runners(self, cell: Cell) -> list[str]:
        """What runs in each repetition of a cell. Where baselines run, "engine" is the stepped
        engine on their thread; over a WebSocket, "socket" is the request through the server,
        whose records make the cell's distributions."""
        if not cell.baselines:
            return ["engine"]
        return ["engine", "bare_loop", "generate_streamer"] + (["socket"] if self.target.mode == "websocket" else [])

    def run_one(self, name: str, prompt: Prompt, output: int, clients: int, prefix: str, compared: bool = False):
        if name == "engine" and compared:
            record = self.on_thread(run_stepped, self.stepped, Job(self.payload(prompt, output)), f"{prefix}-0")
            return [record], (record.end_at - record.sent) if record.sent and record.end_at else 0.0
        if name in ("engine", "socket"):
            return run_jobs(self.target.client, [Job(self.payload(prompt, output))] * clients, prefix)
        if name == "generate_streamer" and self.generate_skip:
            return None
        try:
            if name == "bare_loop":
                return self.on_thread(bl.bare_greedy_loop, self.model, prompt.ids, output, self.eos)
            return self.on_thread(bl.generate_with_streamer, self.model, self.hf_tokenizer, prompt.messages, output,
                                  self.eos)
        except Exception as exc:  # a baseline that breaks is reported, and the run goes on
            self.notes.append(f"{name} failed at prompt {prompt.tokens}, output {output}: {type(exc).__name__}: {exc}")
            return None

    def engine_summary(self, record: RequestRecord) -> dict | None:
        """The engine's side of a comparison, plus its per-token work outside the model step."""
        if record.outcome != "completed":
            return None
        n = len(record.token_ids)
        summary = bl.summary(n, record.prefill_ms, record.engine_itl_ms, n / (record.e2e_ms / 1000))
        model = record.step_ms[1:]  # token k's step_ms: its forward and sampling; token 0 came from prefill
        outside = [gap - step for gap, step in zip(record.engine_itl_ms, model)]
        summary["model_step_ms_median"] = _round(percentile(model, 50))
        summary["outside_model_ms_median"] = _round(percentile(outside, 50))
        return summary

    def compare(self, prompt: Prompt, output: int, rep: int, order: list[str], record: RequestRecord,
                results: dict[str, Any]) -> dict:
        engine = self.engine_summary(record)
        bare, gen = results.get("bare_loop"), results.get("generate_streamer")
        runs = {"engine": engine, "bare_loop": bare.summary() if bare else None,
                "generate_streamer": gen.summary() if gen else None}
        identical = None
        if engine and bare:
            identical = record.token_ids == bare.token_ids and (gen is None or gen.token_ids == bare.token_ids)
        ratios = {"engine_step_over_bare": _ratio(engine, runs["bare_loop"], "step_ms_median"),
                  "engine_step_over_bare_p10": _ratio(engine, runs["bare_loop"], "step_ms_p10"),
                  "engine_tps_over_generate": _ratio(engine, runs["generate_streamer"], "tokens_per_s"),
                  "bare_tps_over_generate": _ratio(runs["bare_loop"], runs["generate_streamer"], "tokens_per_s"),
                  "engine_outside_over_model": _ratio(engine, engine, "outside_model_ms_median",
                                                      "model_step_ms_median")}
        est = None
        if engine:
            est = bl.estimates(self.shape, prompt.tokens, engine["prefill_ms"], engine["step_ms_median"],
                               prompt.tokens + engine["tokens"] / 2)
        return {"prompt_tokens": prompt.tokens, "output_tokens_target": output, "repeat": rep, "order": order,
                **runs, "generate_streamer_skipped": self.generate_skip, "greedy_identical": identical,
                "estimates": est, "ratios": ratios}

    def apply_ceilings(self, cells: list[dict], comparisons: list[dict]) -> None:
        """Turn the estimates into fractions of the final (best) ceilings, once they are known."""
        for cell in cells:
            cell["estimates"] = bl.fractions(cell["estimates"], self.ceilings)
        for c in comparisons:
            if c["estimates"]:
                c["estimates"] = bl.fractions(c["estimates"], self.ceilings)
                c["ratios"]["decode_fraction_of_copy"] = c["estimates"]["decode_fraction_of_copy"]
                c["ratios"]["prefill_fraction_of_matmul"] = c["estimates"]["prefill_fraction_of_matmul"]

    def cell(self, prompt: Prompt, output: int, clients: int, repeats: int, records: list[RequestRecord],
             walls: list[float]) -> dict:
        ok = [r for r in records if r.outcome == "completed"]
        pooled = {
            "queue_ms": [r.queue_ms for r in ok if r.queue_ms is not None],
            "ttft_ms": [r.ttft_ms for r in ok if r.ttft_ms is not None],
            "tpot_ms": [r.tpot_ms for r in ok if r.tpot_ms is not None],
            "itl_ms": [x for r in ok for x in r.itl_ms],
            "e2e_ms": [r.e2e_ms for r in ok if r.e2e_ms is not None],
        }
        tokens = [len(r.token_ids) for r in ok]
        engine_steps = [x for r in ok for x in r.engine_itl_ms]
        prefill = [r.prefill_ms for r in ok if r.prefill_ms is not None]
        mean_out = sum(tokens) / len(tokens) if tokens else 0
        return {
            "prompt_tokens_target": prompt.target, "prompt_tokens": prompt.tokens, "output_tokens_target": output,
            "concurrency": clients, "repeats": repeats, "totals": totals(records),
            "metrics": {m: describe(pooled[m]) for m in METRICS},
            "output_tokens": describe(tokens),
            "throughput_tokens_per_s": round(sum(tokens) / sum(walls), 3) if sum(walls) > 0 and tokens else None,
            "delivery_ms": describe([x for r in ok for x in r.delivery_ms]),
            "delivery_lower_ms": describe([x for r in ok for x in r.delivery_lower_ms]),
            "engine_step_ms": describe(engine_steps),
            "estimates": bl.estimates(self.shape, prompt.tokens, percentile(prefill, 50), percentile(engine_steps, 50),
                                      prompt.tokens + mean_out / 2),
            "requests": [r.to_dict() for r in records],
        }

    def cache_off_probe(self, prompt: Prompt, progress: Progress) -> tuple[dict, list[RequestRecord]]:
        """The same request with and without the KV cache: the engine's model time per step, by step."""
        n = min(CACHE_OFF_TOKENS[self.args.quick], self.facts.context_window - prompt.tokens)
        runs, records = {}, []
        for kv in (True, False):
            progress.step(f"prompt {prompt.tokens} out {n}: kv_cache={str(kv).lower()}",
                          work(prompt.tokens, n) * (1 if kv else 5))
            recs, _ = run_jobs(self.target.client, [Job(self.payload(prompt, n, kv_cache=kv))], f"cache-{kv}".lower())
            records += recs
            steps = recs[0].step_ms[1:]  # index 0 came from the prefill
            runs["with_cache" if kv else "without_cache"] = {
                "outcome": recs[0].outcome, "tokens": len(recs[0].token_ids), "step_ms": [round(s, 3) for s in steps],
                "first_step_ms": round(steps[0], 3) if steps else None,
                "last_step_ms": round(steps[-1], 3) if steps else None,
                "growth": round(steps[-1] / steps[0], 3) if len(steps) > 1 and steps[0] > 0 else None}
        ids = [r.token_ids for r in records]
        probe = {"prompt_tokens": prompt.tokens, **runs,
                 "greedy_identical": ids[0] == ids[1] if all(r.outcome == "completed" for r in records) else None}
        return probe, records


def _ratio(a: dict | None, b: dict | None, key: str, b_key: str | None = None) -> float | None:
    b_key = b_key or key
    if not a or not b or a.get(key) is None or not b.get(b_key):
        return None
    return round(a[key] / b[b_key], 4)


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def totals(records: list[RequestRecord]) -> dict[str, Any]:
    """Every request counted by outcome; `reasons` counts finish reasons, cancel causes and error codes."""
    outcomes = [r.outcome for r in records]
    reasons: dict[str, int] = {}
    for r in records:
        key = f"{r.outcome}:{r.reason}"
        reasons[key] = reasons.get(key, 0) + 1
    return {"requests": len(records), "completed": outcomes.count("completed"), "timeouts": outcomes.count("timeout"),
            "cancelled": outcomes.count("cancelled"), "errors": outcomes.count("error"), "reasons": reasons}


def ratio_report(comparisons: list[dict], cells: list[dict], delivery: tuple[list[float], list[float]],
                 mode: str) -> dict[str, dict]:
    """Each ratio's median over the repetitions with its min-max, beside its target where it has
    one; delivery (upper and lower bounds, every token received) is judged by its p95, with the
    per-cell p95s as its spread."""
    what = {
        "engine_step_over_bare": "engine decode step / bare loop step (medians of token-to-token gaps)",
        "engine_step_over_bare_p10": "the same with 10th percentiles (less swayed by other busy processes)",
        "engine_outside_over_model": "engine per-token work outside model+sampler / model+sampler step, "
                                     "token by token (immune to drift)",
        "engine_tps_over_generate": "engine tokens/s / generate+streamer tokens/s (start -> whole answer)",
        "bare_tps_over_generate": "bare loop tokens/s / generate+streamer tokens/s",
        "decode_fraction_of_copy": "engine decode bytes read per second / machine copy bandwidth (estimate)",
        "prefill_fraction_of_matmul": "engine prefill FLOP/s / machine matmul FLOP/s (estimate)",
    }
    report = {}
    for key, text in what.items():
        values = [c["ratios"][key] for c in comparisons if c["ratios"].get(key) is not None]
        report[key] = _judged(key, text, spread(values), percentile(values, 50))
    per_cell = spread([c["delivery_ms"]["p95"] for c in cells if c["delivery_ms"]["p95"] is not None])
    upper, lower = percentile(delivery[0], 95), percentile(delivery[1], 95)
    if mode == "websocket":  # the target is about the browser's socket, so it is judged there only
        text = ("token event stamped by the engine -> received over the WebSocket, p95 in ms "
                "(upper bound; lower bound beside it)")
        report["delivery_p95_ms"] = _judged("delivery_p95_ms", text, per_cell, upper, lower)
    else:
        text = "token event stamped by the engine -> read by the in-process client thread, p95 in ms"
        report["delivery_p95_ms"] = _judged("", text, per_cell, upper, upper)
    return report


def _judged(key: str, text: str, values: dict, value: float | None, lower: float | None = None) -> dict:
    """A ratio beside its target. With bounds (delivery over a socket) it is met when the upper
    bound meets the target, missed when even the lower bound misses it, and undecided between."""
    direction, target = TARGETS.get(key, (None, None))
    lower = value if lower is None else lower
    met = None
    if target is not None and value is not None:
        meets = (lambda x: x <= target) if direction == "max" else (lambda x: x >= target)
        met = True if meets(value) else False if not meets(lower) else None
    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 4)
    return {"what": text, "target": target, "direction": direction, "value": r(value), "value_lower": r(lower),
            "spread": values, "met": met}


def machine_info(facts) -> dict[str, Any]:
    import torch
    import transformers
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__, "device": facts.device,
            "device_name": facts.device_name, "load_average_start": _load()}


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def run_bench(args: argparse.Namespace) -> int:
    from . import report as report_module
    grid = grid_from(args)
    started_at, t0 = datetime.now(timezone.utc), time.monotonic()
    print(f"kvscope bench: loading {args.model} ({'over ' + args.via_websocket if args.via_websocket else 'in-process'})",
          file=sys.stderr, flush=True)
    target = open_target(args, max(grid.concurrency))
    bench = Bench(args, target, grid)
    try:
        report = measure(bench, started_at, t0)
    finally:
        bench.close()
        target.close()
    return report_module.finish(report, args, started_at)


def fit_prompts(bench: Bench) -> dict[int, Prompt]:
    """A prompt per target length; every prompt + output length must fit the context window."""
    facts, prompts = bench.facts, {}
    for p in bench.grid.prompt_lens:
        prompts[p] = prompt = fit_prompt(bench.target.describe, p)
        longest = prompt.tokens + max(bench.grid.output_lens)
        if longest > facts.context_window:
            raise UserError(f"prompt {prompt.tokens} + output {max(bench.grid.output_lens)} tokens exceeds "
                            f"{facts.name}'s context window of {facts.context_window}; choose smaller "
                            "--prompt-lens or --output-lens", field="prompt_lens")
        if prompt.tokens != p:
            bench.notes.append(f"prompt target {p} tokens: the closest deterministic prompt has {prompt.tokens}")
    return prompts


def measure(bench: Bench, started_at: datetime, t0: float) -> dict:
    """The whole run: ceilings, warm-up, the grid, the no-cache probe; returns the report."""
    args, grid = bench.args, bench.grid
    machine = machine_info(bench.facts)
    prompts = fit_prompts(bench)
    probe_prompt = prompts[grid.prompt_lens[0]]
    total = sum(work(prompts[c.prompt].tokens, c.output) * c.repeats * (c.clients + len(bench.runners(c)) - 1)
                for c in cells_of(grid, args.quick, bench.baselines))
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
        bench.notes.append("where the baselines ran, the engine they were compared with ran its own step() on "
                           "their thread, its worker thread never started (same code per token, same torch "
                           "thread); the other cells used " + ("the server" if bench.target.mode == "websocket"
                                                               else "the engine's worker thread"))
    if bench.generate_skip:
        bench.notes.append(f"generate+streamer baseline skipped: {bench.generate_skip}")
    machine["load_average_end"] = _load()
    ok = [r for r in records if r.outcome == "completed"]
    delivery = ([x for r in ok for x in r.delivery_ms], [x for r in ok for x in r.delivery_lower_ms])
    return {
        "kind": "kvscope-bench", "version": 1, "mode": bench.target.mode, "url": args.via_websocket,
        "started_at": started_at.isoformat(timespec="seconds"), "duration_s": round(time.monotonic() - t0, 1),
        "command": command_line(args, grid), "machine": machine, "model": bench.facts.to_dict(),
        "settings": {"prompt_lens": list(grid.prompt_lens), "output_lens": list(grid.output_lens),
                     "concurrency": list(grid.concurrency), "repeats": grid.repeats, "quick": args.quick,
                     "baselines": bench.baselines, "timeout_s": args.timeout, "sampling": "greedy"},
        "definitions": DEFINITIONS, "ceilings": bench.ceilings, "cells": cells, "comparisons": comparisons,
        "ratios": ratio_report(comparisons, cells, delivery, bench.target.mode),
        "kv_cache_off": probe, "totals": totals(records), "notes": bench.notes,
    }
