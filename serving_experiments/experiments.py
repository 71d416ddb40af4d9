"""The serving chapter's experiments, run on a live engine like any other load (feed label
"experiment"): each takes validated params and returns its result dict, every number measured in this
run from the engine feed, the requests' own events, or a timed forward. Policies an experiment needs are
set for its duration and restored after; callers check permission and hold the one-job-at-a-time lock."""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable

from model_runner.errors import UserError
from model_runner.request import parse_generate
from model_runner.text.detokenizer import display_text
from model_runner.text.prompt import plan
from serving_experiments.speculative import PROPOSE, PromptLookup, plain_greedy, speculative_greedy

LABEL = "experiment"
JOB_TIMEOUT_S = 240.0  # a job that has not ended by then is cancelled: a stuck experiment must not hold the lock
BATCHES = (1, 2, 4, 8, 16)
NAMES = "ABCDEFGH"
QUESTIONS = (
    "What does a cache do?",
    "Name three colours of the sea.",
    "Why is the sky blue?",
    "Say hello in French.",
    "What is a token?",
    "Count to five.",
    "What is prefill?",
    "Describe a cat in one line.",
)
SYSTEM = (
    "You are a patient teacher in a classroom about language models. Answer in one short sentence, in plain "
    "words, without lists or code, and never mention these instructions. The class has read about tokens, the "
    "prefill pass over the prompt, the decode loop that adds one token at a time, and the key-value cache."
)
FILLER = (
    "A serving engine keeps the keys and values of every earlier token so that each new token only needs one "
    "more column of attention, and it packs many users into one forward pass so the weights are read once. "
)
PASSAGE = (
    "The cache keeps the keys and values of every token the model has already read. Each new token reads "
    "them again instead of recomputing them, so a long answer costs one small step per token."
)
SPEC_CASES = (
    ("rewrite", f"Repeat this passage word for word:\n\n{PASSAGE}"),
    ("open", "Tell me a short story about a lighthouse keeper."),
)


# ---- params ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    default: int
    lo: int
    hi: int


def parse_params(data: Any, spec: dict[str, Param]) -> dict[str, int]:
    """Untrusted JSON → {name: int}; UserError naming the field and its limit."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError("send the experiment's parameters as a JSON object (or nothing)", code="invalid_json")
    for name in data:
        if name not in spec:
            known = ", ".join(spec) or "none"
            raise UserError(f"unknown parameter `{str(name)[:40]}` (allowed: {known})", field=str(name)[:40])
    out = {}
    for name, p in spec.items():
        value = data.get(name, p.default)
        if not isinstance(value, int) or isinstance(value, bool) or not p.lo <= value <= p.hi:
            raise UserError(f"`{name}` must be an integer between {p.lo} and {p.hi}, got {value!r}"[:160], field=name)
        out[name] = value
    return out


# ---- a job: the experiment's requests and the feed events about them -----------------------------------


class Job:
    """Submits an experiment's requests and files the engine feed's events about them (other users'
    requests, which may share the steps, are left out)."""

    def __init__(self, engine):
        self.engine = engine
        self.sub = engine.feed.subscribe(capacity=8192)
        self.handles: dict[str, Any] = {}
        self.names: dict[str, str] = {}  # engine key → our name
        self.steps: list[dict] = []  # our engine_step events, rows cut to our requests
        self.log: list[dict] = []  # every feed event about our requests, in order (steps included)
        self.ended: set[str] = set()
        self.settled: set[str] = set()  # ended, and the step it ended in has been read too
        self.terminals: dict[str, dict] = {}  # name → its terminal event, once its stream is drained
        self.deadline = time.monotonic() + JOB_TIMEOUT_S

    def submit(self, name: str, payload: dict) -> None:
        handle = self.engine.submit(parse_generate(payload), label=LABEL)
        self.handles[name] = handle
        self.names[handle.sequence.key] = name

    def submit_together(self, payloads: dict[str, dict]) -> None:
        """Queue requests so that the scheduler first sees them all at once (the first would otherwise
        be admitted alone while the rest are still being submitted): admissions are held meanwhile,
        with the engine's `admissions_held` where it has one (never the teacher's pause)."""
        hold = getattr(self.engine, "admissions_held", None)
        with hold() if hold is not None else nullcontext():
            for name, payload in payloads.items():
                self.submit(name, payload)

    def pump(self, until: Callable[[], bool]) -> None:
        """Read the feed until `until()` holds; cancel everything and fail past the deadline."""
        while not until():
            if time.monotonic() > self.deadline:
                for handle in self.handles.values():
                    handle.cancel()
                raise UserError(f"the experiment did not finish within {JOB_TIMEOUT_S:g} s", code="internal")
            event = self.sub.next_event(timeout=0.2)
            if event is not None:
                self._file(event)

    def _file(self, event: dict) -> None:
        if event["type"] == "engine_step":
            rows = [
                {**row, "request": self.names[row["request"]]} for row in event["batch"] if row["request"] in self.names
            ]
            if rows:
                # a request's end is published inside its last step, before that step's own event
                self.settled.update(r["request"] for r in rows if r["request"] in self.ended)
                step = {**event, "batch": rows}
                self.steps.append(step)
                self.log.append(step)
            return
        name = self.names.get(event.get("request"))
        if name is None:
            return
        self.log.append({**event, "request": name})
        if event["type"] == "engine_end":
            self.ended.add(name)

    def wait(self) -> dict[str, dict]:
        """Until every request has ended → {name: its terminal event}; each stream is drained here."""
        self.pump(lambda: all(h.done for h in self.handles.values()))
        for name, handle in self.handles.items():
            if name not in self.terminals:
                end = self.terminals[name] = [e.to_dict() for e in handle][-1]
                if end["type"] != "finished" or end["reason"] == "timeout":  # a timeout ends it outside any step
                    why = end.get("message") or end.get("cause") or end.get("reason") or ""
                    raise UserError(f"an experiment request ended with {end['type']}: {why}", code="internal")
        self.pump(lambda: len(self.settled) == len(self.handles))  # the feed lags the streams a little
        return dict(self.terminals)

    def close(self) -> None:
        self.sub.close()


@contextmanager
def job(engine, **policy):
    """A Job under `policy` (changes from the policy in force), restored afterwards whatever happens."""
    before = engine.policy
    if policy:
        engine.set_policy(policy)
    j = Job(engine)
    try:
        yield j
    finally:
        j.close()
        for handle in j.handles.values():
            handle.cancel()
        if policy:
            engine.set_policy(before.to_dict())


# ---- helpers ------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: list[float]) -> float | None:
    return percentile(values, 50)


def r3(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def ask(content: str, new_tokens: int, system: str | None = None) -> dict:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    return {"messages": messages, "max_new_tokens": new_tokens}


def text_of_tokens(engine, text: str, tokens: int) -> str:
    """The longest prefix of `text` repeated that has `tokens` tokens in the model's tokenizer."""
    tok = engine.loaded.tokenizer
    long = text * (tokens // 8 + 2)
    ids, offsets = tok.encode(long)
    return long[: offsets[min(tokens, len(ids)) - 1][1]]


def prompt_ids(engine, payload: dict) -> list[int]:
    return plan(engine.loaded.tokenizer, parse_generate(payload), engine.loaded.facts.context_window).ids


def decode_steps_ms(steps: list[dict], name: str) -> list[float]:
    return [s["ms"] for s in steps if any(r["request"] == name and r["kind"] == "decode" for r in s["batch"])]


# ---- why batch: one step's cost against batch size ---------------------------------------------------


WHY_BATCH = {"new_tokens": Param(4, 3, 16)}


def why_batch(engine, params: dict, roofline: Callable[[dict, list[dict]], dict] | None = None) -> dict:
    """b identical requests at once for each batch size; a step whose rows are all b decodes costs
    step_ms, so each user gets 1000/step_ms tokens a second and the batch b times that."""
    points, decodes, prefill = [], [], None
    for b in BATCHES:
        # a token budget that holds every prompt: all b prefill in one step, then decode in lockstep
        policy = {"batching": "continuous", "max_num_seqs": b, "chunked_prefill": False, "max_batch_tokens": 2048}
        with job(engine, **policy) as j:
            payload = ask(QUESTIONS[0], params["new_tokens"])
            j.submit_together({f"u{i}": payload for i in range(b)})
            j.wait()
        full = [s["ms"] for s in j.steps if len(s["batch"]) == b and all(r["kind"] == "decode" for r in s["batch"])]
        # best of the steps, as the machine's ceilings are measured: on a shared CPU the slower
        # repeats measure the neighbours; the median is given beside it
        step_ms = min(full, default=None)
        points.append(
            {
                "batch": b,
                "step_ms": r3(step_ms),
                "step_ms_median": r3(median(full)),
                "per_user_tps": r3(1000 / step_ms) if step_ms else None,
                "aggregate_tps": r3(b * 1000 / step_ms) if step_ms else None,
                "steps_measured": len(full),
            }
        )
        tokens = len(prompt_ids(engine, payload))
        decodes.append({"batch": b, "ms": step_ms, "context": tokens + params["new_tokens"] / 2})
        if b == 1:
            first = [s for s in j.steps if s["batch"][0]["kind"] == "prefill"]
            prefill = {"tokens": tokens, "ms": first[0]["ms"]} if first else None
    result: dict[str, Any] = {"points": points}
    if roofline is not None and prefill is not None:
        result["roofline"] = roofline(prefill, [d for d in decodes if d["ms"]])
    return result


# ---- static vs continuous batching --------------------------------------------------------------------


BATCHING = {"requests": Param(6, 2, 8), "batch_size": Param(3, 1, 8), "new_tokens": Param(10, 4, 16)}


def batching_workload(params: dict) -> list[dict]:
    """Requests of mixed lengths: the short ones end early and (continuous) free their place."""
    n, most = params["requests"], params["new_tokens"]
    lengths = [most if i % 3 == 0 else max(2, most // (2 + i % 3)) for i in range(n)]
    return [{"request": NAMES[i], "question": QUESTIONS[i], "max_new_tokens": lengths[i]} for i in range(n)]


def batching(engine, params: dict) -> dict:
    work = batching_workload(params)
    runs, prompt_tokens = {}, {}
    for mode in ("static", "continuous"):
        with job(engine, batching=mode, max_num_seqs=params["batch_size"], chunked_prefill=False) as j:
            t0 = time.monotonic()
            j.submit_together({w["request"]: ask(w["question"], w["max_new_tokens"]) for w in work})
            ends = j.wait()
            wall = time.monotonic() - t0
        runs[mode] = batching_run(j, ends, wall, params["batch_size"])
        prompt_tokens = {e["request"]: e["prompt_tokens"] for e in j.log if e["type"] == "engine_admit"}
    workload = [
        {
            "request": w["request"],
            "prompt_tokens": prompt_tokens.get(w["request"]),
            "max_new_tokens": w["max_new_tokens"],
        }
        for w in work
    ]
    return {"workload": workload, "batch_size": params["batch_size"], "runs": runs}


def grid(j: Job) -> list[dict]:
    """One row per step of ours: what each request did in it, replayed from the feed in order."""
    state = {name: "waiting" for name in j.handles}
    rows = []
    for event in j.log:
        kind, name = event["type"], event.get("request")
        if kind == "engine_admit":
            state[name] = "idle"  # running: its place in the batch is held, its work comes in the step
        elif kind == "engine_preempt":
            state[name] = "preempted"
        elif kind == "engine_end":
            state[name] = "done"
        elif kind == "engine_step":
            ran = {r["request"]: ("decode" if r["kind"] == "decode" else "prefill") for r in event["batch"]}
            cells = {n: ran.get(n, state[n]) for n in j.handles}
            rows.append({"step": len(rows) + 1, "ms": event["ms"], "cells": cells})
    return rows


def batching_run(j: Job, ends: dict[str, dict], wall_s: float, slots: int) -> dict:
    steps = grid(j)
    tokens = sum(e["tokens"] for e in ends.values())
    busy = sum(sum(1 for c in s["cells"].values() if c in ("prefill", "decode")) for s in steps)
    return {
        "steps": steps,
        "throughput_tps": r3(tokens / wall_s) if wall_s > 0 else None,
        "p95_latency_ms": r3(percentile([e["metrics"]["e2e_ms"] for e in ends.values()], 95)),
        "idle_slot_share": r3(1 - busy / (len(steps) * slots)) if steps else None,
        "tokens": tokens,
        "wall_ms": r3(wall_s * 1000),
    }


# ---- paged KV blocks ----------------------------------------------------------------------------------


PAGED_BLOCKS = {"requests": Param(3, 2, 6), "new_tokens": Param(8, 2, 16)}


def paged_blocks(engine, params: dict) -> dict:
    """Requests of different lengths on the pool as it is configured; frames replay which request
    held which block at each step (from the feed's per-row block lists)."""
    facts = engine.loaded.facts
    kv = engine.snapshot()["kv"]
    with job(engine) as j:
        j.submit_together(
            {NAMES[i]: ask(QUESTIONS[i], params["new_tokens"] + 4 * i, SYSTEM) for i in range(params["requests"])}
        )
        j.wait()
    frames, peak = block_frames(j)
    ids = sorted({b for f in frames for b in f["owners"]})  # the blocks the job touched, by physical id
    for f in frames:
        f["owners"] = [f["owners"].get(b) for b in ids]
    return {
        "frames": frames,
        "block_ids": ids,
        "block_size": kv["block_size"],
        "bytes_per_block": kv["bytes_per_block"],
        "pool_blocks": kv["total"],
        "reserved_bytes": peak["blocks"] * kv["bytes_per_block"],
        "used_bytes": peak["tokens"] * facts.kv_bytes_per_token,
        "pool_bytes": kv["total"] * kv["bytes_per_block"],
        "contiguous_bytes": params["requests"] * facts.context_window * facts.kv_bytes_per_token,
        "contiguous_basis": f"{params['requests']} requests x {facts.context_window} positions (the context window)",
        "kv_bytes_per_token": facts.kv_bytes_per_token,
    }


def block_frames(j: Job) -> tuple[list[dict], dict]:
    """Frames of block ownership ({block id: request}), and the frame where our requests held the most blocks
    ({blocks, tokens} there: tokens whose keys and values sit in those blocks)."""
    held: dict[str, list[int]] = {}
    tokens: dict[str, int] = {}
    ended: set[str] = set()
    frames, peak = [], {"blocks": 0, "tokens": 0}
    for event in j.log:
        name = event.get("request")
        if event["type"] == "engine_admit":
            tokens[name] = event["cached_tokens"]
        elif event["type"] == "engine_end":
            held.pop(name, None)
            tokens.pop(name, None)
            ended.add(name)
        elif event["type"] == "engine_step":
            shared: set[int] = set()
            for row in event["batch"]:
                if row["request"] in ended:  # its last step: its blocks are already back in the pool
                    continue
                held[row["request"]] = row["blocks"]
                tokens[row["request"]] = tokens.get(row["request"], 0) + row["tokens"]
                shared.update(row["shared_blocks"])
            owners: dict[int, str] = {}
            for owner, blocks in held.items():
                for b in blocks:
                    owners.setdefault(b, owner)
            frames.append({"step": len(frames) + 1, "owners": owners, "shared": sorted(shared)})
            count = len({b for bs in held.values() for b in bs})
            if count >= peak["blocks"]:
                peak = {"blocks": count, "tokens": sum(tokens.get(n, 0) for n in held)}
    return frames, peak


# ---- chunked prefill ----------------------------------------------------------------------------------


CHUNKED = {"chunk_size": Param(32, 8, 256), "long_prompt_tokens": Param(192, 64, 1024), "new_tokens": Param(12, 6, 24)}


def chunked_prefill(engine, params: dict) -> dict:
    """Two requests decode; a long prompt arrives. Off: its whole prefill is one step, a long gap in
    their token stream. On: it comes in chunks that share steps with their decodes."""
    long_text = text_of_tokens(engine, FILLER, params["long_prompt_tokens"])
    runs, long_tokens = {}, None
    for mode in ("off", "on"):
        policy = {"batching": "continuous", "max_num_seqs": 4, "chunked_prefill": mode == "on"}
        if mode == "on":
            policy["chunk_size"] = params["chunk_size"]
        with job(engine, **policy) as j:
            j.submit_together({name: ask(QUESTIONS[i], params["new_tokens"]) for i, name in enumerate("AB")})
            j.pump(lambda: all(decode_steps_ms(j.steps, n) for n in ("A", "B")))
            j.submit("long", ask(long_text + "\nSum that up in five words.", 2))
            ends = j.wait()
        runs[mode] = chunked_run(j, ends)
        long_tokens = next(e["prompt_tokens"] for e in j.log if e["type"] == "engine_admit" and e["request"] == "long")
    return {"chunk_size": params["chunk_size"], "long_prompt_tokens": long_tokens, "runs": runs}


def chunked_run(j: Job, ends: dict[str, dict]) -> dict:
    gaps = []
    for name in ("A", "B"):
        times = [s["t_ms"] for s in j.steps if any(r["request"] == name and r["kind"] == "decode" for r in s["batch"])]
        gaps.append([r3(b - a) for a, b in zip(times, times[1:])])
    flat = [g for gs in gaps for g in gs]
    return {
        "gaps_ms": gaps,
        "max_gap_ms": r3(max(flat)) if flat else None,
        "p95_gap_ms": r3(percentile(flat, 95)),
        "long_ttft_ms": ends["long"]["metrics"]["ttft_ms"],
        "long_prefill_steps": sum(
            1 for s in j.steps if any(r["request"] == "long" and r["kind"] == "prefill" for r in s["batch"])
        ),
    }


# ---- prefix caching -----------------------------------------------------------------------------------


PREFIX = {"requests": Param(3, 2, 4), "new_tokens": Param(2, 1, 8)}


def prefix_caching(engine, params: dict) -> dict:
    """The same system prompt before different questions, one request after another, with prefix
    caching off and then on: with it on, later requests find the prompt's full blocks in the cache."""
    block_size = engine.snapshot()["kv"]["block_size"]
    runs = {}
    for mode in ("off", "on"):  # off first: turning it off drops any cached blocks, so "on" starts cold
        with job(engine, prefix_caching=mode == "on", chunked_prefill=False) as j:
            for i in range(params["requests"]):
                j.submit(NAMES[i], ask(QUESTIONS[i], params["new_tokens"], SYSTEM))
                j.wait()
        runs[mode] = {"requests": prefix_rows(j, block_size)}
    system_tokens = len(engine.loaded.tokenizer.encode(SYSTEM)[0])
    return {"system_prompt_tokens": system_tokens, "block_size": block_size, "runs": runs}


def prefix_rows(j: Job, block_size: int) -> list[dict]:
    rows = []
    for name, handle in j.handles.items():
        admit = next(e for e in j.log if e["type"] == "engine_admit" and e["request"] == name)
        end = handle.terminal.to_dict()
        rows.append(
            {
                "request": name,
                "ttft_ms": end["metrics"]["ttft_ms"],
                "prompt_tokens": admit["prompt_tokens"],
                "prefill_tokens": admit["prompt_tokens"] - admit["cached_tokens"],
                "cached_tokens": admit["cached_tokens"],
                # the full blocks it took from the prefix cache instead of computing them
                "shared_blocks": admit["cached_tokens"] // block_size,
            }
        )
    return rows


# ---- speculative decoding -----------------------------------------------------------------------------


SPECULATIVE = {"new_tokens": Param(16, 4, 48), "k": Param(PROPOSE, 1, 8)}
SPEC_RUNS = 2


def speculative(engine, params: dict, proposer=None) -> dict:
    """Each case decoded greedily on the engine's weights, plainly and with speculation (each twice,
    alternating; the faster run of each is kept), outputs compared token by token."""
    loaded = engine.loaded
    proposer = proposer or PromptLookup()
    cases = []
    for kind, prompt in SPEC_CASES:
        ids = prompt_ids(engine, ask(prompt, params["new_tokens"]))
        plains, specs = [], []
        for _ in range(SPEC_RUNS):  # alternated, and the better of each kept: neither always runs first on a busy CPU
            plains.append(plain_greedy(loaded.model, ids, params["new_tokens"], loaded.tokenizer.eos_ids))
            specs.append(
                speculative_greedy(
                    loaded.model, ids, params["new_tokens"], loaded.tokenizer.eos_ids, proposer, params["k"]
                )
            )
        plain, spec = min(plains, key=lambda r: r.seconds), min(specs, key=lambda r: r.seconds)
        cases.append(spec_case(loaded.tokenizer, kind, prompt, plain, spec))
    return {"method": proposer.name, "k": params["k"], "cases": cases}


def spec_case(tok, kind: str, prompt: str, plain, spec) -> dict:
    def text(i: int) -> str:
        return display_text(tok, i)

    return {
        "kind": kind,
        "prompt": prompt,
        "steps": [
            {
                "proposed": [text(t) for t in s.proposed],
                "accepted": s.accepted,
                "rejected": s.rejected,
                "bonus": text(s.bonus) if s.bonus is not None else None,
            }
            for s in spec.steps
        ],
        "proposed": spec.proposed,
        "accepted": spec.accepted,
        "tokens": len(spec.token_ids),
        "forwards": len(spec.steps),
        "plain_forwards": len(plain.steps),
        "acceptance_rate": r3(spec.accepted / spec.proposed) if spec.proposed else None,
        "plain_ms": r3(plain.seconds * 1000),
        "spec_ms": r3(spec.seconds * 1000),
        "speedup": r3(plain.seconds / spec.seconds) if spec.seconds > 0 else None,
        "identical": plain.token_ids == spec.token_ids,
        # where the two outputs part (None when identical): low-precision kernels (the int8 route's bfloat16
        # activations) can round a near-tie differently in a (k+1)-token forward than in a 1-token one
        "diverged_at": next((i for i, (a, b) in enumerate(zip(plain.token_ids, spec.token_ids)) if a != b), None)
        if plain.token_ids != spec.token_ids
        else None,
        "text": "".join(text(t) for t in spec.token_ids),
    }


# ---- pricing ------------------------------------------------------------------------------------------


PRICING = {"prompt_tokens": Param(128, 16, 1024), "new_tokens": Param(8, 3, 32)}
PRICING_RUNS = 2


def pricing(engine, params: dict) -> dict:
    """One request alone, run twice: its prefill steps' ms per prompt token against its decode steps'
    median ms per token, each the better of the two runs (the slower run measured a busy machine)."""
    text = text_of_tokens(engine, FILLER, params["prompt_tokens"])
    runs = []
    for _ in range(PRICING_RUNS):
        with job(engine) as j:
            j.submit("A", ask(text + "\nWhat is this about?", params["new_tokens"]))
            j.wait()
        prefill = [s for s in j.steps if s["batch"][0]["kind"] == "prefill"]
        tokens = sum(s["batch"][0]["tokens"] for s in prefill)
        decode = decode_steps_ms(j.steps, "A")
        runs.append({"tokens": tokens, "prefill_ms": sum(s["ms"] for s in prefill), "decode": decode})
    per_prompt = min(r["prefill_ms"] / r["tokens"] for r in runs)
    per_output = min(median(r["decode"]) for r in runs)
    return {
        "prefill_ms_per_token": r3(per_prompt),
        "decode_ms_per_token": r3(per_output),
        "ratio": r3(per_output / per_prompt),
        "prompt_tokens": runs[0]["tokens"],
        "new_tokens": len(runs[0]["decode"]) + 1,
        "prefill_ms": [r3(r["prefill_ms"]) for r in runs],
        "decode_ms_median": [r3(median(r["decode"])) for r in runs],
    }


# ---- the registry -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    params: dict[str, Param]
    run: Callable[..., dict]
    needs_policy: bool  # sets a scheduling policy for its duration (only where policy changes are allowed)


EXPERIMENTS = {
    e.name: e
    for e in (
        Experiment("why_batch", "Why batch: one step's cost against batch size", WHY_BATCH, why_batch, True),
        Experiment("batching", "Static against continuous batching", BATCHING, batching, True),
        Experiment("paged_blocks", "Paged KV blocks", PAGED_BLOCKS, paged_blocks, False),
        Experiment("chunked_prefill", "Chunked prefill", CHUNKED, chunked_prefill, True),
        Experiment("prefix_caching", "Prefix caching", PREFIX, prefix_caching, True),
        Experiment("speculative", "Speculative decoding", SPECULATIVE, speculative, False),
        Experiment("pricing", "Prefill against decode: the price of a token", PRICING, pricing, False),
    )
}


def experiment(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise UserError(
            f"no experiment named `{name[:40]}`; known: {', '.join(EXPERIMENTS)}", code="not_found", field="name"
        )
    return EXPERIMENTS[name]


# ---- the contract's shapes (docs/protocol.md "Experiments API"), checked in one place ----------------------

RESULT_KEYS = {
    "why_batch": {"points"},
    "batching": {"workload", "runs"},
    "paged_blocks": {
        "frames",
        "block_size",
        "bytes_per_block",
        "pool_blocks",
        "reserved_bytes",
        "used_bytes",
        "pool_bytes",
        "contiguous_bytes",
    },
    "chunked_prefill": {"chunk_size", "long_prompt_tokens", "runs"},
    "prefix_caching": {"system_prompt_tokens", "runs"},
    "speculative": {"method", "cases"},
    "pricing": {"prefill_ms_per_token", "decode_ms_per_token", "ratio", "prompt_tokens", "new_tokens"},
}
CELLS = {"prefill", "decode", "waiting", "idle", "done", "preempted"}


def _missing(where: str, data: Any, keys: set[str]) -> list[str]:
    if not isinstance(data, dict):
        return [f"{where}: not an object"]
    return [f"{where}: no `{k}`" for k in sorted(keys - set(data))]


def check_response(name: str, body: Any) -> list[str]:
    """What is wrong with a 200 answer of POST /api/experiments/<name> (or a trace's copy); [] = fits."""
    problems = _missing(name, body, {"name", "provenance", "machine", "params", "result"})
    if problems:
        return problems
    if body["name"] != name or body["provenance"] != "measured":
        problems.append(f"{name}: name {body['name']!r} / provenance {body['provenance']!r}")
    problems += _missing(f"{name}.machine", body["machine"], {"threads", "load_1m"})
    result = body["result"]
    problems += _missing(f"{name}.result", result, RESULT_KEYS.get(name, set()))
    if problems:
        return problems
    return problems + RESULT_CHECKS[name](result)


def _check_why_batch(result: dict) -> list[str]:
    out = [p for point in result["points"] for p in _missing("why_batch.points[]", point, {"batch", "step_ms"})]
    if [p["batch"] for p in result["points"]] != list(BATCHES):
        out.append(f"why_batch: batches {[p.get('batch') for p in result['points']]} != {list(BATCHES)}")
    if "roofline" in result:
        out += _missing("why_batch.roofline", result["roofline"], {"peak_flops_s", "bandwidth_bytes_s", "points"})
    return out


def _check_run_steps(where: str, run: dict, requests: set[str]) -> list[str]:
    out = _missing(where, run, {"steps", "throughput_tps", "p95_latency_ms", "idle_slot_share"})
    for step in run.get("steps", []):
        if set(step["cells"]) != requests or not set(step["cells"].values()) <= CELLS:
            out.append(f"{where}: step {step.get('step')} cells {step['cells']}")
            break
    return out


def _check_batching(result: dict) -> list[str]:
    requests = {w["request"] for w in result["workload"]}
    out = _missing("batching.runs", result["runs"], {"static", "continuous"})
    for mode in ("static", "continuous"):
        out += _check_run_steps(f"batching.runs.{mode}", result["runs"].get(mode, {}), requests)
    return out


def _check_paged(result: dict) -> list[str]:
    out = []
    for frame in result["frames"]:
        if len(frame["owners"]) != len(result.get("block_ids", frame["owners"])) or not isinstance(
            frame["shared"], list
        ):
            out.append(f"paged_blocks: frame {frame.get('step')} owners/shared")
            break
    if not result["frames"]:
        out.append("paged_blocks: no frames")
    return out


def _check_chunked(result: dict) -> list[str]:
    out = _missing("chunked_prefill.runs", result["runs"], {"off", "on"})
    for mode, run in result["runs"].items():
        out += _missing(f"chunked_prefill.runs.{mode}", run, {"gaps_ms", "max_gap_ms", "p95_gap_ms", "long_ttft_ms"})
    return out


def _check_prefix(result: dict) -> list[str]:
    out = _missing("prefix_caching.runs", result["runs"], {"off", "on"})
    keys = {"ttft_ms", "prefill_tokens", "cached_tokens", "shared_blocks"}
    for mode, run in result["runs"].items():
        out += [p for r in run.get("requests", []) for p in _missing(f"prefix_caching.{mode}.requests[]", r, keys)]
    return out


def _check_speculative(result: dict) -> list[str]:
    keys = {"kind", "prompt", "steps", "proposed", "accepted", "tokens", "acceptance_rate", "plain_ms", "spec_ms"}
    out = []
    for case in result["cases"]:
        out += _missing("speculative.cases[]", case, keys | {"speedup", "identical"})
        if not out and sum(s["accepted"] + (s["bonus"] is not None) for s in case["steps"]) != case["tokens"]:
            out.append(f"speculative: case {case['kind']}: accepted + bonus tokens != tokens")
    return out


RESULT_CHECKS = {
    "why_batch": _check_why_batch,
    "batching": _check_batching,
    "paged_blocks": _check_paged,
    "chunked_prefill": _check_chunked,
    "prefix_caching": _check_prefix,
    "speculative": _check_speculative,
    "pricing": lambda result: [],
}


def check_trace(data: Any) -> list[str]:
    """What is wrong with static/data/serving-trace.json (schema 1, one 200 answer per experiment); [] = fits."""
    problems = _missing("trace", data, {"schema", "recorded_on", "experiments"})
    if problems:
        return problems
    if data["schema"] != 1:
        problems.append(f"trace: schema {data['schema']!r} != 1")
    problems += _missing("trace.recorded_on", data["recorded_on"], {"machine", "load_1m", "date", "model"})
    problems += [f"trace: no experiment `{n}`" for n in EXPERIMENTS if n not in data["experiments"]]
    for name, body in data["experiments"].items():
        problems += check_response(name, body)
    return problems
