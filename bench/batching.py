"""`kvscope bench --batching` and `--class`: continuous batching on the in-process engine, measured in
one run against the same requests served one at a time (policy max_num_seqs=1) and against
transformers' own ContinuousBatchingManager (`generate_batch`) on the same model object; a lone
client's decode step against the bare loop; and the class scenario (class_scenario.py). Every
ratio is taken between runs of the same repeat of the same run; greedy outputs are compared
request by request."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from model_runner.protocol.errors import UserError

from . import baselines as bl
from . import class_scenario
from . import report as floor
from .batching_report import SCHEMA, print_report, ratios
from .clients import Job, RequestRecord, run_jobs, run_stepped
from .grid import Bench, Grid
from .measure import Progress, Prompt, Target, fit_prompt, load_average, machine_info, open_target, work
from .report import greedy_equality, outputs, run_summary, totals

DEFAULTS = {"prompt": 64, "output": 32, "concurrency": (8, 16), "repeats": 1}


@dataclass
class BatchingRun:
    """The opened engine and what every part of the run shares."""

    args: argparse.Namespace
    target: Target
    progress: Progress
    notes: list[str] = field(default_factory=list)

    @property
    def engine(self):
        return self.target.client.engine

    @property
    def model(self):
        return self.target.loaded.model

    @property
    def eos(self) -> frozenset[int]:
        return self.target.loaded.tokenizer.eos_ids

    def payload(self, prompt: Prompt, output: int) -> dict:
        payload = {"messages": prompt.messages, "max_new_tokens": output}
        if self.args.timeout:
            payload["timeout_s"] = self.args.timeout
        return payload

    def engine_run(self, jobs: list[Job], prefix: str, **policy) -> tuple[list[RequestRecord], float, dict]:
        """The jobs as concurrent clients under the starting policy changed by `policy`, restored after;
        (records, wall seconds, the engine's counters over the run: steps, preemptions, prefix hits)."""
        engine, start = self.engine, self.engine.policy
        if policy:
            engine.set_policy(**policy)
        before = engine.snapshot()
        try:
            records, wall = run_jobs(self.target.client, jobs, prefix)
        finally:
            engine.set_policy(**start.to_dict())
        after = engine.snapshot()
        return records, wall, {k: after[k] - before[k] for k in ("steps", "preemptions", "prefix_hit_tokens")}

    def flush_prefix_cache(self, prompt: Prompt) -> None:
        """Drop the blocks kept for their prefix, so a run starts with a cold prefix cache: prefix
        caching off, one tiny request (the pool applies the policy at its next step)."""
        self.engine.set_policy(prefix_caching=False)
        run_jobs(self.target.client, [Job(self.payload(prompt, 1))], "flush")


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    if args.quick:
        raise UserError(
            "--quick sizes the grid; --batching and --class have their own sizes "
            "(--prompt-lens, --output-lens, --concurrency, --repeats)",
            field="quick",
        )
    if args.via_websocket:
        raise UserError(
            "--batching and --class drive the in-process engine (they change its policy between "
            "runs); leave out --via-websocket",
            field="via_websocket",
        )
    for name in ("prompt_lens", "output_lens"):
        if getattr(args, name) and len(getattr(args, name)) > 1:
            raise UserError(f"--batching takes one value of --{name.replace('_', '-')}", field=name)
    repeats = args.repeats or DEFAULTS["repeats"]
    if repeats < 1:
        raise UserError("--repeats must be at least 1", field="repeats")
    if args.arrival_s < 0:
        raise UserError("--arrival-s must be 0 or more seconds", field="arrival_s")
    return {
        "prompt_tokens_target": (args.prompt_lens or (DEFAULTS["prompt"],))[0],
        "output_tokens": (args.output_lens or (DEFAULTS["output"],))[0],
        "concurrency": list(args.concurrency or DEFAULTS["concurrency"]),
        "repeats": repeats,
        "batching": args.batching,
        "class": args.class_scenario,
        "seed": args.seed,
        "arrival_s": args.arrival_s,
        "baselines": not args.no_baselines,
        "kv_cache_mb": args.kv_cache_mb,
        "sampling": "greedy",
    }


def command_line(args: argparse.Namespace, s: dict) -> str:
    parts = ["kvscope bench"] + (["--batching"] if s["batching"] else []) + (["--class"] if s["class"] else [])
    parts += [f"--model {args.model}"] + ([f"--device {args.device}"] if args.device != "auto" else [])
    parts += [f"--dtype {args.dtype}"] if args.dtype != "auto" else []
    parts += [f"--decoder {args.decoder}"] if getattr(args, "decoder", "auto") != "auto" else []
    if s["batching"]:
        parts += [
            f"--prompt-lens {s['prompt_tokens_target']}",
            f"--output-lens {s['output_tokens']}",
            f"--concurrency {','.join(map(str, s['concurrency']))}",
        ]
    parts += [f"--repeats {s['repeats']}"]
    parts += [f"--seed {s['seed']}", f"--arrival-s {s['arrival_s']:g}"] if s["class"] else []
    parts += [f"--kv-cache-mb {s['kv_cache_mb']:g}"] if s["kv_cache_mb"] else []
    parts += [f"--timeout {args.timeout:g}"] if args.timeout else []
    parts += ["--no-baselines"] if args.no_baselines else []
    return " ".join(parts)


def run_batching(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    started_at, t0 = datetime.now(UTC), time.monotonic()
    print(f"kvscope bench: loading {args.model} (in-process)", file=sys.stderr, flush=True)
    # transformers logs every paged cache it sizes at INFO; the run makes several
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.WARNING)
    target = open_target(args, max(settings["concurrency"] + [class_scenario.CLASS_CLIENTS]))
    try:
        report = measure_batching(
            BatchingRun(args, target, Progress(1, enabled=False), list(target.notes)), settings, started_at, t0
        )
    finally:
        target.close()
    return floor.finish(report, args.json, started_at, print_report, sys.stdout, SCHEMA, "bench-batching")


def measure_batching(session: BatchingRun, s: dict, started_at: datetime, t0: float) -> dict:
    machine = machine_info(session.target.loaded.facts)
    engine, describe = session.engine, session.target.describe
    hf_skip = bl.generate_batch_unavailable(session.model) if s["baselines"] else "--no-baselines"
    prompts = [fit_prompt(describe, s["prompt_tokens_target"], variant=i) for i in range(max(s["concurrency"]))]
    classroom = class_scenario.requests(describe, s["seed"], s["arrival_s"]) if s["class"] else None
    session.progress = Progress(_planned_work(s, prompts, classroom), enabled=not session.args.no_progress)
    session.progress.step("warming up", 0)
    _warm_up(session, prompts, hf_skip)
    throughput = (
        [
            _clients(session, s, prompts[:n], rep, hf_skip, turn=i * s["repeats"] + rep)
            for i, n in enumerate(s["concurrency"])
            for rep in range(s["repeats"])
        ]
        if s["batching"]
        else []
    )
    lone = _lone(session, prompts[0], s) if s["batching"] and s["baselines"] else None
    scenario = class_scenario.run(session, classroom) if classroom else None
    session.progress.close()
    if hf_skip and s["batching"]:
        session.notes.append(f"transformers generate_batch baseline skipped: {hf_skip}")
    machine["load_average_end"] = load_average()
    records = [r for t in throughput for run in t.pop("_records") for r in run]
    records += [r for sc in (scenario or {}).get("scenarios", {}).values() for r in sc.pop("_records")]
    return {
        "kind": "kvscope-bench-batching",
        "version": 1,
        "mode": "in-process",
        "started_at": started_at.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - t0, 1),
        "command": command_line(session.args, s),
        "machine": machine,
        "model": session.target.loaded.facts.to_dict(),
        "settings": {
            **s,
            "policy": engine.policy.to_dict(),
            "decoder": engine.snapshot().get("decoder"),  # native or transformers (--decoder)
            "kv_blocks": engine.snapshot()["kv"]["total"],
            "prompt_tokens": [p.tokens for p in prompts] if s["batching"] else [],
        },
        "throughput": throughput,
        "lone": lone,
        "class": scenario,
        "ratios": ratios(throughput, lone, scenario),
        "totals": totals(records),
        "notes": session.notes,
    }


def _planned_work(s: dict, prompts: list[Prompt], classroom) -> float:
    one = work(prompts[0].tokens, s["output_tokens"])
    total = sum(n * one * (1 + 2 / 3) for n in s["concurrency"]) * s["repeats"] if s["batching"] else 0
    total += 2 * one * s["repeats"] if s["batching"] and s["baselines"] else 0
    if classroom:
        total += 2 * 1.3 * sum(work(r.prompt.tokens, r.output) for r in classroom)
    return total


def _warm_up(session: BatchingRun, prompts: list[Prompt], hf_skip: str | None) -> None:
    """Untimed: a small batch through the engine, and transformers' manager once."""
    records, _, _ = session.engine_run([Job(session.payload(p, 4)) for p in prompts[:4]], "warmup")
    if any(r.outcome != "completed" for r in records):
        bad = next(r for r in records if r.outcome != "completed")
        raise UserError(
            f"the warm-up requests did not complete ({bad.outcome}: {bad.reason} {bad.message or ''}); "
            "nothing to measure",
            code="bench_failed",
        )
    if hf_skip is None:
        _hf(session, prompts[:2], 4)


def _hf(session: BatchingRun, prompts: list[Prompt], output: int) -> bl.BatchRun:
    kv, policy = session.engine.snapshot()["kv"], session.engine.policy
    return bl.hf_generate_batch(
        session.model,
        [p.ids for p in prompts],
        output,
        session.eos,
        kv["total"],
        kv["block_size"],
        policy.max_batch_tokens,
    )


def _clients(session: BatchingRun, s: dict, prompts: list[Prompt], rep: int, hf_skip: str | None, turn: int) -> dict:
    """One repeat at n clients: the same requests batched, one at a time and through generate_batch,
    in an order that rotates from one such run to the next (`turn`)."""
    n, out = len(prompts), s["output_tokens"]
    jobs = [Job(session.payload(p, out)) for p in prompts]
    names = ["batched", "serial"] + ([] if hf_skip else ["hf"])
    order = names[turn % len(names) :] + names[: turn % len(names)]
    runs: dict[str, Any] = {"hf": None}
    recs: dict[str, list[RequestRecord]] = {}
    for name in order:
        session.progress.step(
            f"{n} clients, repeat {rep + 1}: {name}", n * work(prompts[0].tokens, out) / (1 if name == "serial" else 3)
        )
        if name == "hf":
            try:
                hf = _hf(session, prompts, out)
                runs["hf"] = {
                    "requests": n,
                    "completed": n,
                    "output_tokens": hf.tokens,
                    "wall_s": round(hf.wall_s, 3),
                    "tokens_per_s": round(hf.tokens / hf.wall_s, 3) if hf.wall_s > 0 else None,
                    "call_s": round(hf.call_s, 3),
                    "call_tokens_per_s": round(hf.tokens / hf.call_s, 3) if hf.call_s > 0 else None,
                }
                recs["hf_tokens"] = hf.token_ids
            except Exception as exc:  # a baseline that breaks is reported, and the run goes on
                session.notes.append(f"generate_batch failed at {n} clients: {type(exc).__name__}: {exc}")
            continue
        policy = {"max_num_seqs": 1} if name == "serial" else {}
        records, wall, counters = session.engine_run(jobs, f"{name}{n}-r{rep}", **policy)
        runs[name], recs[name] = run_summary(records, wall, counters), records
    serial = outputs(recs["serial"])
    b, sr, hf = runs["batched"], runs["serial"], runs["hf"]
    return {
        "clients": n,
        "repeat": rep,
        "order": order,
        **runs,
        "greedy": {
            "batched_vs_serial": greedy_equality(outputs(recs["batched"]), serial),
            "hf_vs_serial": greedy_equality(recs["hf_tokens"], serial) if "hf_tokens" in recs else None,
        },
        "ratios": {
            "batched_over_serial": _ratio(b, sr),
            "batched_over_hf": _ratio(b, hf),
            "hf_over_serial": _ratio(hf, sr),
        },
        "_records": [recs["batched"], recs["serial"]],
    }


def _ratio(a: dict | None, b: dict | None) -> float | None:
    if not a or not b or not a.get("tokens_per_s") or not b.get("tokens_per_s"):
        return None
    return round(a["tokens_per_s"] / b["tokens_per_s"], 4)


def _lone(session: BatchingRun, prompt: Prompt, s: dict) -> dict:
    """A lone client: the engine (policy max_num_seqs=1, stepped on the baselines' thread) against the
    bare greedy loop, order rotating each repeat, as `kvscope bench` compares them."""
    out, reps = s["output_tokens"], s["repeats"]
    bench = Bench(session.args, session.target, Grid((prompt.target,), (out,), (1,), reps))
    try:
        bench.stepped.set_policy(max_num_seqs=1)
        bench.on_thread(run_stepped, bench.stepped, Job(session.payload(prompt, 4)), "lone-warmup")
        bench.on_thread(bl.bare_greedy_loop, session.model, prompt.ids, 4, session.eos)
        comparisons = []
        for rep in range(reps):
            order = ["engine", "bare_loop"][rep % 2 :] + ["engine", "bare_loop"][: rep % 2]
            results = {}
            for name in order:
                session.progress.step(f"lone client, repeat {rep + 1}: {name}", work(prompt.tokens, out))
                results[name] = bench.run_one(name, prompt, out, 1, f"lone-r{rep}", compared=True)
            comparisons.append(bench.compare(prompt, out, rep, order, results["engine"][0][0], results))
    finally:
        bench.close()
    session.notes += [n for n in bench.notes if n not in session.notes]
    return {"prompt_tokens": prompt.tokens, "output_tokens_target": out, "comparisons": comparisons}
