"""Attention is not free: one request at a time, each a prefix of one long text, its decode steps timed
by the engine at a growing number of cached positions (prefix caching on, so each prompt reuses the
shorter one's blocks); per length the best and median step, cost.py's KV bytes read, a straight line
fitted through step ms against positions (its intercept: the step with no cache), and the weights-only
floor computed from cost.py's weight bytes over the machine's measured copy bandwidth."""

from __future__ import annotations

from typing import Any

from formulas import cost
from model_runner.loading.model_shape import shape_of
from model_runner.protocol.metrics import percentile
from model_runner.protocol.request import parse_generate
from model_runner.text.prompt import render
from serving_experiments import roofline
from serving_experiments.harness import Job, Param, admit_of, ask, decode_steps, job, r3, text_of_tokens
from serving_experiments.prompts import FILLER

LENGTHS = (64, 256, 512, 1024, 2048, 4096, 8192)  # the cached lengths aimed at (prompt tokens)
# max_positions' default: the recorded run took about 10 s on this project's 2-core CPU (docs/protocol.md)
PARAMS = {"max_positions": Param(2048, 64, 8192), "new_tokens": Param(8, 4, 32)}
# A long prompt goes in chunks of this many positions: one 8,192-position pass would hold 8,192 x 8,192
# attention scores per head at once, and each chunk still reads every key cached before it.
PREFILL_CHUNK = 512
QUESTION = "\nWhat is this text about?"
# A message may hold 20,000 characters (model_runner/protocol/request.py LIMITS): the text is sent as user messages
# cut at fixed offsets, so a shorter prompt's messages stay the first ones of a longer prompt's.
MESSAGE_CHARS = 15_000


def run(engine, params: dict) -> dict:
    new = params["new_tokens"]
    limit = room(engine, new)
    targets = [n for n in LENGTHS if n <= params["max_positions"]]
    points: list[dict] = []
    shared: list[dict] = []  # lengths whose every decode step was shared with other users' rows: not timed
    with job(engine, prefix_caching=True) as j:
        for target in targets:
            at_limit = target > limit["prompt_tokens"]
            aim = min(target, limit["prompt_tokens"])
            if points and aim <= points[-1]["prompt_tokens"]:
                break  # the pool or the window is already reached
            j.submit(f"n{target}", payload_for(engine, aim, new))
            j.wait()
            point = {"target": target, "at_limit": at_limit, **measured_point(j, f"n{target}")}
            (points if point["steps_measured"] else shared).append(point)
            if at_limit:
                break
    result = summary(engine, points, limit, [n for n in targets if n > limit["prompt_tokens"]])
    return {**result, "not_timed": [p["target"] for p in shared]}


def room(engine, new_tokens: int) -> dict:
    """The longest prompt that fits with `new_tokens` after it: a request's positions must fit both the
    context window and the whole paged pool."""
    facts = engine.local.loaded.facts
    kv = engine.snapshot()["kv"]
    pool = kv["total"] * kv["block_size"]
    window = facts.context_window
    held_by = "the KV pool" if pool < window else "the model's context window"
    return {
        "prompt_tokens": min(pool, window) - new_tokens,
        "pool_positions": pool,
        "context_window": window,
        "held_by": held_by,
    }


def payload_for(engine, tokens: int, new_tokens: int) -> dict:
    """A request whose rendered prompt has at most `tokens` tokens: a prefix of the repeated filler (so
    every prompt is a prefix of one text), the question after it; cut by the excess until the template fits."""
    overhead = rendered_tokens(engine, ask(QUESTION, new_tokens))
    content = max(1, tokens - overhead)
    while True:
        text = text_of_tokens(engine, FILLER, content) + QUESTION
        parts = [text[i : i + MESSAGE_CHARS] for i in range(0, len(text), MESSAGE_CHARS)]
        messages = [{"role": "user", "content": part} for part in parts]
        payload = {"messages": messages, "max_new_tokens": new_tokens, "prefill_chunk": PREFILL_CHUNK}
        excess = rendered_tokens(engine, payload) - tokens
        if excess <= 0 or content == 1:
            return payload
        content = max(1, content - excess)


def rendered_tokens(engine, payload: dict) -> int:
    """The prompt's tokens as the engine renders it, before the window check (a first cut may be over it)."""
    params = parse_generate(payload)
    return render(engine.local.loaded.tokenizer, params.messages, params.chat_template).prompt_tokens


def lone_decode_steps(j: Job, name: str, prompt_tokens: int) -> list[dict]:
    """{step, cached_positions, ms} of each decode step of `name` that ran alone: its k-th decode step's query
    reads the prompt's positions, the k tokens decoded before it and its own (written in the same step), so
    prompt + k + 1 keys. Steps shared with other rows are left out."""
    out = []
    for k, step in enumerate(decode_steps(j.steps, name)):
        if step["batch_tokens"] == 1:
            out.append({"step": step["step"], "cached_positions": prompt_tokens + k + 1, "ms": step["ms"]})
    return out


def measured_point(j: Job, name: str) -> dict:
    admit = admit_of(j, name)
    prompt = admit["prompt_tokens"]
    steps = lone_decode_steps(j, name, prompt)
    ms = [s["ms"] for s in steps]
    positions = [s["cached_positions"] for s in steps]
    prefill = [s["ms"] for s in j.steps if any(r["request"] == name and r["kind"] == "prefill" for r in s["batch"])]
    return {
        "prompt_tokens": prompt,
        "cached_tokens": admit["cached_tokens"],  # found in the prefix cache: not prefilled again
        "prefill_tokens": prompt - admit["cached_tokens"],
        "prefill_ms": r3(sum(prefill)),
        "cached_positions": r3(sum(positions) / len(positions)) if steps else None,
        # best of the steps, as why_batch: on a shared CPU the slower repeats measure the neighbours
        "step_ms": r3(min(ms, default=None)),
        "step_ms_median": r3(percentile(ms, 50)),
        "steps_measured": len(ms),
        "steps": steps,
    }


def line_fit(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """Least squares y = a + b x: (a, b), or None below two distinct x."""
    n = len(xs)
    mx, my = sum(xs) / max(n, 1), sum(ys) / max(n, 1)
    sxx = sum((x - mx) ** 2 for x in xs)
    if n < 2 or sxx == 0:
        return None
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - b * mx, b


def fitted(points: list[dict]) -> dict | None:
    """The line through each length's best step: its intercept (ms at no cached position) and slope."""
    usable = [p for p in points if p["step_ms"] is not None]
    fit = line_fit([p["cached_positions"] for p in usable], [p["step_ms"] for p in usable])
    if fit is None:
        return None
    intercept, slope = fit
    return {
        "intercept_ms": r3(intercept),
        "slope_us_per_1k_positions": r3(slope * 1e6),  # ms per position → µs per 1,000 positions
        "points_fitted": len(usable),
        "basis": "least squares through each length's best step (step_ms) against its mean cached positions",
    }


def floor_of(loaded) -> dict:
    """The weights-only floor and the KV slope the machine's bandwidth implies (computed: cost.py's bytes,
    the roofline's measured copy bandwidth)."""
    shape = shape_of(loaded)
    _, bandwidth = roofline.ceilings(loaded.facts.device, shape.route)
    weights = cost.weight_bytes_read(shape, 1, decode=True)
    return {
        "weight_bytes": weights,
        "bandwidth_bytes_s": round(bandwidth, 1),
        "floor_ms": r3(weights / bandwidth * 1000),
        "kv_us_per_1k_positions": r3(cost.kv_bytes_read(shape, 1000) / bandwidth * 1e6),
        "basis": "cost.py's weight bytes of one decode step (and KV bytes of 1,000 positions) over the copy "
        "bandwidth the roofline measured on the machine that ran it (256 MiB copy, bytes read + written)",
    }


def summary(engine, points: list[dict], limit: dict, not_reached: list[int]) -> dict[str, Any]:
    loaded = engine.local.loaded
    shape = shape_of(loaded)
    for p in points:
        p["kv_bytes_read"] = None if p["cached_positions"] is None else cost.kv_bytes_read(shape, p["cached_positions"])
    stopped = None
    if not_reached:
        stopped = (
            f"{', '.join(f'{n:,}' for n in not_reached)} positions not reached: {limit['held_by']} holds "
            f"{min(limit['pool_positions'], limit['context_window']):,} positions, the answer's tokens included"
        )
    return {
        "points": points,
        "fit": fitted(points),
        "floor": floor_of(loaded),
        "kv_bytes_per_token": shape.kv_bytes_per_token,
        "limit": limit,
        "not_reached": not_reached,
        "stopped": stopped,
        "prefill_chunk": PREFILL_CHUNK,
    }
