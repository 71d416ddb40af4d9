"""`kvscope bench --structured`: what a structured-output mask costs a decode step, in one in-process run.
The same greedy requests run plain and constrained (a JSON schema, a choice), interleaved and in alternating
order, alone and `--concurrency` at once; each pair's ratio is the constrained phase's median decode step
over the plain one's, reported as a median with its min-max over `--repeats`, beside xgrammar's compile times
and whether every constrained answer parsed. Speed appears only as ratios from the same run."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone
from typing import Any, TextIO

import torch

from model_runner.local.engine import Engine, EngineConfig
from model_runner.protocol.constraint import make_constraint
from model_runner.protocol.request import parse_generate
from model_runner.shared.constraints import Compiler, Guide, compiled
from serving_experiments.prompts import QUESTIONS

from . import report as floor
from .invariance import collect
from .measure import load_average, machine_info

# Enums and booleans only: a greedy small model could run an unbounded string or number past any budget,
# and then the answer would be a prefix, not JSON that parses.
SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"type": "string", "enum": ["language", "nature", "machines", "greetings", "numbers"]},
        "difficulty": {"type": "string", "enum": ["easy", "medium", "hard"]},
        "needs_a_picture": {"type": "boolean"},
    },
    "required": ["topic", "difficulty", "needs_a_picture"],
    "additionalProperties": False,
}
CHOICES = ["a short answer will do", "this needs a longer explanation", "I am not sure"]
CASES = {"json_schema": ("json_schema", SCHEMA), "choice": ("choice", CHOICES)}
BUDGET = 128  # max new tokens of a constrained answer (bytes on the fake model); the answers close well within it


def parses(case: str, text: str) -> bool:
    """Whether a constrained answer is what its constraint promised: schema-shaped JSON, or one of the choices."""
    if case == "choice":
        return text in CHOICES
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    return (
        isinstance(value, dict)
        and set(value) == set(SCHEMA["required"])
        and value["topic"] in SCHEMA["properties"]["topic"]["enum"]
        and isinstance(value["needs_a_picture"], bool)
    )


def request(question: str, case: str | None, tokens: int):
    """A greedy request: constrained by `case` within BUDGET, or plain for exactly `tokens` tokens."""
    fields: dict[str, Any] = {"messages": [{"role": "user", "content": question}], "sampling": {"temperature": 0}}
    if case is None:
        fields |= {"max_new_tokens": tokens, "ignore_eos": True}
    else:
        kind, spec = CASES[case]
        fields |= {"max_new_tokens": BUDGET, "constraint": {"kind": kind, "spec": spec}}
    return parse_generate(fields)


def run_phase(engine: Engine, questions: list[str], case: str | None, lengths: list[int]) -> dict[str, Any]:
    """The questions all at once: the median decode step (the gaps between token events) and each answer."""
    with engine.admissions_held():
        handles = [engine.submit(request(q, case, n), label="bench-structured") for q, n in zip(questions, lengths)]
    ends, steps = [], []
    for handle in handles:
        events = [e.to_dict() for e in handle]
        if events[-1]["type"] != "finished":
            raise RuntimeError(f"a bench request ended with {events[-1]['type']}: {events[-1]}")
        ends.append(events[-1])
        # The gaps between its token events: the whole step (forward, mask, sampling, events); a token event's
        # own step_ms is the forward alone, which the mask is not part of.
        steps += events[-1]["metrics"]["itl_ms"]
    return {"step_ms": statistics.median(steps), "steps": len(steps), "ends": ends}


def compile_times(engine: Engine) -> dict[str, float]:
    """A fresh xgrammar compiler for the tokenizer (what a server's first constrained request pays once),
    then each case's grammar on it (a schema after that: its own cache is empty)."""
    tokenizer, vocab = engine.loaded.tokenizer, engine.facts.vocab_size
    t0 = time.perf_counter()
    compiler = Compiler(tokenizer, vocab)
    out = {"compiler_ms": round((time.perf_counter() - t0) * 1000, 2)}
    for case, (kind, spec) in CASES.items():
        t0 = time.perf_counter()
        compiler.compile(make_constraint(kind, spec, "constraint"))
        out[case] = round((time.perf_counter() - t0) * 1000, 3)
    return out


def mask_times(engine: Engine, case: str, answers: list[list[int]]) -> dict[str, Any]:
    """The mask alone, replayed over the pilot's constrained answers (the grammar states a real answer passes
    through): per step the bitmask fill, and the whole per-request mask step the engine runs (fill, count the
    allowed tokens, apply to the logits), on random float32 logits of the vocabulary's width."""
    kind, spec = CASES[case]
    vocab = engine.facts.vocab_size
    grammar = compiled(make_constraint(kind, spec, "constraint"), engine.loaded.tokenizer, vocab)
    fills, steps = [], []
    for ids in answers:
        guide = Guide(grammar, vocab)
        for token in ids:
            logits = torch.randn(vocab)  # (vocab,) float32
            t0 = time.perf_counter()
            guide.matcher.fill_next_token_bitmask(guide.bitmask)
            t1 = time.perf_counter()
            guide.apply(logits)
            steps.append((time.perf_counter() - t1) * 1000)
            fills.append((t1 - t0) * 1000)
            guide.accept(token)
    return {"steps": len(steps), "fill_ms_median": round(statistics.median(fills), 4),
            "mask_step_ms_median": round(statistics.median(steps), 4)}  # fmt: skip


def measure(engine: Engine, questions: list[str], concurrency: list[int], repeats: int) -> tuple[list, dict, dict]:
    """Each case's constrained answers alone (a pilot: their lengths, and the mask replayed over them), then per
    clients, case and repeat the plain and constrained phases back to back, their order alternating; (rows,
    answers counted by whether they parse, the mask's own times)."""
    pilot = {c: [collect([engine.submit(request(q, c, 0))])[0] for q in questions] for c in CASES}
    lengths = {c: [end["tokens"] for end in ends] for c, ends in pilot.items()}
    masks = {c: mask_times(engine, c, [end["ids"] for end in ends]) for c, ends in pilot.items()}
    answers = {c: {"answers": 0, "parsed": 0, "unparsed": []} for c in CASES}
    rows = []
    for clients in concurrency:
        for case in CASES:
            qs, ns = questions[:clients], lengths[case][:clients]
            row = {"case": case, "clients": clients, "plain_step_ms": [], "constrained_step_ms": [], "ratios": []}
            for repeat in range(repeats):
                order = (None, case) if repeat % 2 == 0 else (case, None)
                runs = {kind: run_phase(engine, qs, kind, ns) for kind in order}
                plain, constrained = runs[None], runs[case]
                plain_ms, constrained_ms = round(plain["step_ms"], 4), round(constrained["step_ms"], 4)
                row["plain_step_ms"].append(plain_ms)
                row["constrained_step_ms"].append(constrained_ms)
                row["ratios"].append(round(constrained_ms / plain_ms, 4))  # from the figures as written
                for end in constrained["ends"]:
                    counted = answers[case]
                    counted["answers"] += 1
                    ok = parses(case, end["text"])
                    counted["parsed"] += ok
                    counted["unparsed"] += [] if ok else [end["text"]]
            row["ratio"] = floor.spread(row["ratios"])
            rows.append(row)
    return rows, answers, masks


def run_structured(args: argparse.Namespace) -> int:
    concurrency = sorted({1, max(args.concurrency or (4,))})
    repeats = args.repeats or 3
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(max(concurrency))]
    started, t0 = datetime.now(timezone.utc), time.monotonic()
    print(f"kvscope bench --structured: loading {args.model}", file=sys.stderr, flush=True)
    engine = Engine(EngineConfig(model=args.model, device=args.device, dtype=args.dtype, timeout_s=600.0)).start()
    engine.wait_ready(900)
    try:
        machine = machine_info(engine.facts) | {"cpu_model": cpu_model()}
        compile_ms = compile_times(engine)
        collect([engine.submit(request(questions[0], None, 4))])  # warm-up: a fresh process's first steps
        rows, answers, masks = measure(engine, questions, concurrency, repeats)
        facts = engine.facts.to_dict()
    finally:
        engine.shutdown()
    machine["load_average_end"] = load_average()
    count = 2 * sum(a["answers"] for a in answers.values())  # the measured phases, plain and constrained
    report = {
        "kind": "kvscope-bench-structured",
        "version": 1,
        "mode": "in-process",
        "started_at": started.isoformat(timespec="seconds"),
        "duration_s": round(time.monotonic() - t0, 1),
        "command": f"kvscope bench --structured --model {args.model} --concurrency {max(concurrency)} "
        f"--repeats {repeats}",
        "machine": machine,
        "model": facts,
        "settings": {"concurrency": concurrency, "repeats": repeats, "budget": BUDGET, "sampling": "greedy"},
        "constraints": {case: {"kind": kind, "spec": spec} for case, (kind, spec) in CASES.items()},
        "compile_ms": compile_ms,
        "cases": rows,
        "mask_alone": masks,
        "answers": answers,
        "ratios": {
            f"{r['case']}_{r['clients']}": floor.judged(
                f"{r['clients']} client(s), {r['case']}: median decode step constrained / plain", r["ratio"],
                r["ratio"]["median"], None,
            )
            for r in rows
        },
        "totals": {"requests": count, "completed": count, "timeouts": 0, "cancelled": 0, "errors": 0, "reasons": {}},
        "notes": [
            "each plain request generates exactly the tokens its constrained twin took in the pilot (ignore_eos), "
            "so both phases run the same steps at the same batch sizes",
            "a step is the gap between a request's consecutive token events (the finished event's itl_ms: forward, "
            "mask, sampling and events), pooled over the phase's requests; a token event's step_ms is the forward "
            "alone",
            "totals count the measured phases' requests; the warm-up and the pilot ran before them",
        ],
    }  # fmt: skip
    return floor.finish(report, args.json, started, print_table, sys.stdout, SCHEMA_OUT, "bench-structured")


def cpu_model() -> str | None:
    """The processor's name as the kernel reports it (platform.processor() is often only the architecture)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), None)
    except OSError:
        return None


ROW = {
    "type": "object",
    "required": ["case", "clients", "plain_step_ms", "constrained_step_ms", "ratios", "ratio"],
    "properties": {
        "case": {"enum": list(CASES)},
        "clients": floor.INT,
        "plain_step_ms": {"type": "array", "items": floor.NUM},
        "constrained_step_ms": {"type": "array", "items": floor.NUM},
        "ratios": {"type": "array", "items": floor.NUM},
        "ratio": floor.SPREAD,
    },
}
MASK = {
    "type": "object",
    "required": ["steps", "fill_ms_median", "mask_step_ms_median"],
    "properties": {"steps": floor.INT, "fill_ms_median": floor.NUM, "mask_step_ms_median": floor.NUM},
}
SCHEMA_OUT = floor.report_schema(
    "kvscope-bench-structured",
    ["in-process"],
    model=["name"],
    settings=["concurrency", "repeats", "budget", "sampling"],
    constraints={"type": "object", "required": list(CASES)},
    compile_ms={"type": "object", "required": ["compiler_ms", *CASES], "additionalProperties": floor.NUM},
    cases={"type": "array", "items": ROW},
    answers={"type": "object", "required": list(CASES)},
    mask_alone={"type": "object", "required": list(CASES), "additionalProperties": MASK},
)


def print_table(result: dict, out: TextIO) -> None:
    m = result["machine"]
    print(f"{m.get('cpu_model')}, {m['cpu_count']} cores, {m['torch_threads']} torch threads; load average "
          f"{m['load_average_start']} before, {m['load_average_end']} after", file=out)  # fmt: skip
    c = result["compile_ms"]
    print(f"compile: tokenizer's compiler {c['compiler_ms']:.0f} ms, then "
          + ", ".join(f"{k} {c[k]:.2f} ms" for k in CASES), file=out)  # fmt: skip
    print(f"{'case':<12} {'clients':>7} {'plain step':>11} {'constrained':>12}  constrained / plain", file=out)
    for r in result["cases"]:
        print(f"{r['case']:<12} {r['clients']:>7} {statistics.median(r['plain_step_ms']):>9.1f}ms "
              f"{statistics.median(r['constrained_step_ms']):>10.1f}ms  {floor.fmt_ratio(r['ratio'], 3)}",
              file=out)  # fmt: skip
    for case, m in result["mask_alone"].items():
        print(f"{case}: the mask alone, median over {m['steps']} steps: fill {m['fill_ms_median']:.3f} ms, "
              f"whole mask step {m['mask_step_ms_median']:.3f} ms", file=out)  # fmt: skip
    for case, a in result["answers"].items():
        print(f"{case}: {a['parsed']} of {a['answers']} constrained answers parsed", file=out)
