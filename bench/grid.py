"""`kvscope bench`, the grid: prompt lengths x output lengths x concurrent clients, repeated, on an opened
Target; the machine's ceilings, a warm-up, every cell (with the baselines interleaved where there is one
client) and the kv_cache=false probe, each turned into the report's cell, comparison and probe dicts that
its JSON contract (SCHEMA) holds."""

from __future__ import annotations

import argparse
import itertools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from model_runner.loading.model_shape import shape_of
from model_runner.protocol.errors import UserError
from model_runner.protocol.metrics import percentile
from serving_experiments import roofline

from . import baselines as bl
from . import report as floor
from .clients import Job, RequestRecord, run_jobs, run_stepped
from .measure import Progress, Prompt, Target, work
from .report import DIST, INT, METRICS, NUM, OPT_NUM, REQUEST, STR, TOTALS, describe, latency_samples


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


# ---- one session ---------------------------------------------------------------------------------


class Bench:
    def __init__(self, args: argparse.Namespace, target: Target, grid: Grid):
        self.args, self.target, self.grid = args, target, grid
        self.model = target.loaded.model
        self.facts = target.loaded.facts
        self.shape = shape_of(target.loaded)
        self.eos = target.loaded.tokenizer.eos_ids
        self.hf_tokenizer = getattr(target.loaded.tokenizer, "tok", None)
        self.baselines = not args.no_baselines
        self.generate_skip = bl.generate_streamer_unavailable(self.model, self.hf_tokenizer) if self.baselines else None
        self.notes: list[str] = list(target.notes)
        self.ceilings: dict[str, Any] = {}
        # The comparisons run all their model work on one thread: on a busy 2-core machine the same
        # torch loop measured up to 3x slower on one thread than on another (see
        # docs/history/2026-12-02-performance.md, "A trap on shared CPUs: which thread runs torch"),
        # which would swamp a 3 % target. So the engine compared with the baselines is a second
        # Engine on the same model object, its worker never started, stepped on this thread.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bench-baseline")
        self.stepped = None
        if self.baselines:
            from model_runner.local.engine import Engine, EngineConfig

            config = EngineConfig(model=args.model, timeout_s=600.0, decoder=getattr(args, "decoder", "auto"))
            self.stepped = Engine(config, loaded=target.loaded)

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
        ceiling measured while others were busy would make every fraction look better than it is. The
        compute ceiling is measured in the kernel the layers run (the route's int4/int8 kernel, or a matmul)."""
        import torch

        device = torch.device(self.facts.device)
        copy = self.on_thread(roofline.copy_bandwidth, device)
        matmul = self.on_thread(roofline.compute_rate, device, self.shape.route)
        if self.ceilings:
            copy = max(copy, self.ceilings["copy"], key=lambda m: m["gb_per_s"])
            matmul = max(matmul, self.ceilings["matmul"], key=lambda m: m["gflop_per_s"])
        self.ceilings = {
            "copy_gb_per_s": copy["gb_per_s"],
            "matmul_gflop_per_s": matmul["gflop_per_s"],
            "copy": copy,
            "matmul": matmul,
        }

    def warm_up(self, prompt: Prompt) -> None:
        """One short run of each, untimed: first calls pay for allocation and lazy imports."""
        records, _ = run_jobs(self.target.client, [Job(self.payload(prompt, 4))], "warmup")
        if records[0].outcome != "completed":
            raise UserError(
                f"the warm-up request did not complete ({records[0].outcome}: {records[0].reason} "
                f"{records[0].message or ''}); nothing to measure",
                code="bench_failed",
            )
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
                order = runners[rep % len(runners) :] + runners[: rep % len(runners)]
                results: dict[str, Any] = {}
                for name in order:
                    progress.step(
                        f"prompt {prompt.tokens} out {o} x{c} rep {rep + 1}/{cell.repeats}: {name}",
                        work(prompt.tokens, o) * (c if name in ("engine", "socket") else 1),
                    )
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
            return self.on_thread(
                bl.generate_with_streamer, self.model, self.hf_tokenizer, prompt.messages, output, self.eos
            )
        except Exception as exc:  # a baseline that breaks is reported, and the run goes on
            self.notes.append(f"{name} failed at prompt {prompt.tokens}, output {output}: {type(exc).__name__}: {exc}")
            return None

    def compare(
        self, prompt: Prompt, output: int, rep: int, order: list[str], record: RequestRecord, results: dict[str, Any]
    ) -> dict:
        head = {"prompt_tokens": prompt.tokens, "output_tokens_target": output, "repeat": rep, "order": order}
        return {**head, **bl.comparison(self.shape, prompt.tokens, record, results, self.generate_skip)}

    def apply_ceilings(self, cells: list[dict], comparisons: list[dict]) -> None:
        """Turn the estimates into fractions of the final (best) ceilings, once they are known."""
        for cell in cells:
            cell["estimates"] = bl.fractions(cell["estimates"], self.ceilings)
        for c in comparisons:
            if c["estimates"]:
                c["estimates"] = bl.fractions(c["estimates"], self.ceilings)
                c["ratios"]["decode_fraction_of_copy"] = c["estimates"]["decode_fraction_of_copy"]
                c["ratios"]["prefill_fraction_of_matmul"] = c["estimates"]["prefill_fraction_of_matmul"]

    def cell(
        self, prompt: Prompt, output: int, clients: int, repeats: int, records: list[RequestRecord], walls: list[float]
    ) -> dict:
        ok = [r for r in records if r.outcome == "completed"]
        pooled = latency_samples(ok)
        tokens = [len(r.token_ids) for r in ok]
        engine_steps = [x for r in ok for x in r.engine_itl_ms]
        prefill = [r.prefill_ms for r in ok if r.prefill_ms is not None]
        mean_out = sum(tokens) / len(tokens) if tokens else 0
        return {
            "prompt_tokens_target": prompt.target,
            "prompt_tokens": prompt.tokens,
            "output_tokens_target": output,
            "concurrency": clients,
            "repeats": repeats,
            "totals": floor.totals(records),
            "metrics": {m: describe(pooled[m]) for m in METRICS},
            "output_tokens": describe(tokens),
            "throughput_tokens_per_s": round(sum(tokens) / sum(walls), 3) if sum(walls) > 0 and tokens else None,
            "delivery_ms": describe([x for r in ok for x in r.delivery_ms]),
            "delivery_lower_ms": describe([x for r in ok for x in r.delivery_lower_ms]),
            "engine_step_ms": describe(engine_steps),
            "estimates": bl.estimates(
                self.shape,
                prompt.tokens,
                percentile(prefill, 50),
                percentile(engine_steps, 50),
                prompt.tokens + mean_out / 2,
            ),
            "requests": [r.to_dict() for r in records],
        }

    def cache_off_probe(self, prompt: Prompt, progress: Progress) -> tuple[dict, list[RequestRecord]]:
        """The same request with and without the KV cache: the engine's model time per step, by step."""
        n = min(CACHE_OFF_TOKENS[self.args.quick], self.facts.context_window - prompt.tokens)
        runs, records = {}, []
        for kv in (True, False):
            progress.step(
                f"prompt {prompt.tokens} out {n}: kv_cache={str(kv).lower()}", work(prompt.tokens, n) * (1 if kv else 5)
            )
            recs, _ = run_jobs(self.target.client, [Job(self.payload(prompt, n, kv_cache=kv))], f"cache-{kv}".lower())
            records += recs
            steps = recs[0].step_ms[1:]  # index 0 came from the prefill
            runs["with_cache" if kv else "without_cache"] = {
                "outcome": recs[0].outcome,
                "tokens": len(recs[0].token_ids),
                "step_ms": [round(s, 3) for s in steps],
                "first_step_ms": round(steps[0], 3) if steps else None,
                "last_step_ms": round(steps[-1], 3) if steps else None,
                "growth": round(steps[-1] / steps[0], 3) if len(steps) > 1 and steps[0] > 0 else None,
            }
        return {"prompt_tokens": prompt.tokens, **runs, **cache_off_agreement(*records)}, records


def cache_off_agreement(cached: RequestRecord, uncached: RequestRecord) -> dict:
    """Whether the answers with and without the cache are the same tokens, and if not, where they part and the
    cached run's top-two gap there. Without the cache every step is a forward over the whole sequence, which
    sums in another order than a one-token step (on int4/int8 it is a prompt-sized step, on the kept float32
    weights): the two can part only where the top two are within that rounding (a near-tie), so the gap
    says whether a difference is rounding or a bug."""
    if not cached.outcome == uncached.outcome == "completed":
        return {"greedy_identical": None, "first_difference": None, "top_two_gap_there": None}
    first = floor.first_difference(cached.token_ids, uncached.token_ids)
    gaps = cached.top_two_gaps
    return {
        "greedy_identical": first is None,
        "first_difference": first,
        "top_two_gap_there": None
        if first is None or first >= len(gaps) or gaps[first] is None
        else round(gaps[first], 4),
    }


# ---- the output's contract ----------------------------------------------------------------------

CELL = {
    "type": "object",
    "required": [
        "prompt_tokens_target",
        "prompt_tokens",
        "output_tokens_target",
        "concurrency",
        "repeats",
        "totals",
        "metrics",
        "output_tokens",
        "throughput_tokens_per_s",
        "delivery_ms",
        "delivery_lower_ms",
        "estimates",
        "requests",
    ],
    "properties": {
        "prompt_tokens_target": INT,
        "prompt_tokens": INT,
        "output_tokens_target": INT,
        "concurrency": INT,
        "repeats": INT,
        "totals": TOTALS,
        "metrics": {"type": "object", "required": list(METRICS), "properties": {m: DIST for m in METRICS}},
        "output_tokens": DIST,
        "throughput_tokens_per_s": OPT_NUM,
        "delivery_ms": DIST,
        "delivery_lower_ms": DIST,
        "estimates": {"type": "object"},
        "requests": {"type": "array", "items": REQUEST},
    },
}
RUNNER = {
    "type": ["object", "null"],
    "required": ["tokens", "prefill_ms", "step_ms_median", "step_ms_p10", "tokens_per_s"],
    "properties": {
        "tokens": INT,
        "prefill_ms": OPT_NUM,
        "step_ms_median": OPT_NUM,
        "step_ms_p10": OPT_NUM,
        "tokens_per_s": OPT_NUM,
    },
}
COMPARISON = {
    "type": "object",
    "required": [
        "prompt_tokens",
        "output_tokens_target",
        "repeat",
        "order",
        "engine",
        "bare_loop",
        "generate_streamer",
        "greedy_identical",
        "estimates",
        "ratios",
    ],
    "properties": {
        "prompt_tokens": INT,
        "output_tokens_target": INT,
        "repeat": INT,
        "order": {"type": "array", "items": STR},
        "engine": RUNNER,
        "bare_loop": RUNNER,
        "generate_streamer": RUNNER,
        "greedy_identical": {"type": ["boolean", "null"]},
        "estimates": {"type": ["object", "null"]},
        "ratios": {"type": "object", "additionalProperties": OPT_NUM},
    },
}
SCHEMA = floor.report_schema(
    "kvscope-bench",
    ["in-process", "websocket"],
    model=["name", "params", "weights_bytes", "kv_bytes_per_token"],
    settings=["prompt_lens", "output_lens", "concurrency", "repeats"],
    definitions={"type": "object"},
    ceilings={
        "type": "object",
        "required": ["copy_gb_per_s", "matmul_gflop_per_s"],
        "properties": {"copy_gb_per_s": NUM, "matmul_gflop_per_s": NUM},
    },
    cells={"type": "array", "items": CELL},
    comparisons={"type": "array", "items": COMPARISON},
    kv_cache_off={"type": ["object", "null"]},
)
