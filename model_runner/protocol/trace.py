"""kvscope traces (docs/trace-format.md): a recorded run of one request, every event in arrival
order, which the page plays before any live run. `validate_trace` is the Python side of the format
check (the browser's is static/js/trace.js); `record` makes a trace from a ready engine (with
attention inspection when its request asks for it) and `dumps_trace` writes one compactly."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
from datetime import datetime, timezone

from model_runner.protocol.events import EVENT_TYPES, TERMINAL_TYPES

FORMAT, VERSION = "kvscope-trace", 1
REQUEST_ID = "walkthrough-example"

# The walkthrough's example: a system prompt, one earlier exchange, a retrieved passage and the new
# question; greedy, so a live run of the same model repeats the recorded text. The question asks about
# the passage, which the 135M model answers correctly on the int4 route (asked why the cache grows, it
# wrote a repetitive, wrong sentence).
EXAMPLE_REQUEST = {
    "messages": [
        {"role": "system", "content": "You are a concise assistant. Answer in one or two plain sentences."},
        {"role": "user", "content": "What is a token?"},
        {
            "role": "assistant",
            "content": "A token is a small piece of text, often a word or part of a word, "
            "that the model reads and writes.",
        },
        {
            "role": "retrieved",
            "content": "While it generates, a transformer keeps the keys and values of every "
            "earlier position in a KV cache, so each new step only computes the newest token.",
        },
        {"role": "user", "content": "According to the passage, what does a transformer keep while it generates?"},
    ],
    "max_new_tokens": 40,
    "sampling": {"temperature": 0, "top_k": None, "top_p": 1.0, "seed": None},
    "stop": [],
    "delivery": "stream",
    "kv_cache": True,
    "prefill_chunk": 0,
    "overflow": "reject",
}


def with_attention(request: dict) -> dict:
    """The request with attention inspection on: its run then sends an `attention` event (what the new
    token's query read from the cache) before each `token` (docs/protocol.md)."""
    return {**request, "inspect": {"attention": True}}


MODEL_FIELDS = ("name", "layers", "kv_heads", "head_dim", "bytes_per_element", "context_window", "kv_bytes_per_token")
TOKEN_FIELDS = ("id", "text", "source")


# May be absent: an error's `field`, and a token's `mask` (traces recorded before constraints existed
# have none; a token without one was not constrained).
OPTIONAL_FIELDS = frozenset({"field", "mask"})


def event_fields(type_: str) -> set[str]:
    """The keys an event of this type carries on the wire (events.Event.to_dict)."""
    return {"type", "schema"} | {f.name for f in dataclasses.fields(EVENT_TYPES[type_])}


def validate_trace(trace: object) -> list[str]:
    """Every problem with a trace, as short sentences; [] means it is a complete, well-formed run."""
    if not isinstance(trace, dict):
        return ["the trace is not a JSON object"]
    problems = []
    if trace.get("format") != FORMAT:
        problems.append(f'`format` must be "{FORMAT}"')
    if trace.get("version") != VERSION:
        problems.append(f"`version` must be {VERSION}")
    model = trace.get("model")
    if not isinstance(model, dict) or any(k not in model for k in MODEL_FIELDS):
        problems.append(f"`model` must hold {', '.join(MODEL_FIELDS)}")
    request = trace.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("messages"), list):
        problems.append("`request.messages` must be a list")
    prompt = trace.get("prompt")
    if prompt is not None:
        tokens = prompt.get("tokens") if isinstance(prompt, dict) else None
        if not isinstance(tokens, list) or any(
            not isinstance(t, dict) or any(k not in t for k in TOKEN_FIELDS) for t in tokens
        ):
            problems.append("`prompt.tokens` must be a list of {id, text, source, ...}")
    events = trace.get("events")
    if not isinstance(events, list) or not events:
        return problems + ["`events` must be a non-empty list"]
    layers = model.get("layers") if isinstance(model, dict) else None
    inspected = isinstance(request, dict) and (request.get("inspect") or {}).get("attention") is True
    return problems + event_problems(events, layers, inspected)


def event_problems(events: list, layers: object, inspected: bool) -> list[str]:
    """What is wrong with a run's events: unknown types, missing fields, time going back, tokens out of
    order, the terminal event not last; with `inspected`, a token without its `attention` event."""
    problems = []
    last_t, next_index, read_for = float("-inf"), 0, None
    for i, event in enumerate(events):
        where = f"events[{i}]"
        if not isinstance(event, dict) or event.get("type") not in EVENT_TYPES:
            problems.append(f"{where} is not a protocol event")
            continue
        missing = event_fields(event["type"]) - set(event) - OPTIONAL_FIELDS
        if missing:
            problems.append(f"{where} ({event['type']}) lacks {', '.join(sorted(missing))}")
        t = event.get("t_ms")
        if not isinstance(t, (int, float)) or t < last_t:
            problems.append(f"{where}.t_ms must be a number that never goes back")
        else:
            last_t = t
        if event["type"] == "attention" and not missing:
            problems += attention_problems(event, where, next_index, layers, read_for)
            read_for = event.get("index")
        if event["type"] == "token":
            if event.get("index") != next_index:
                problems.append(f"{where} is token {event.get('index')}, expected {next_index}")
            if inspected and read_for != event.get("index"):
                problems.append(f"{where} is token {event.get('index')} without its attention event before it")
            next_index = event.get("index", next_index) + 1
        if event["type"] in TERMINAL_TYPES and i != len(events) - 1:
            problems.append(f"{where} is terminal but not the last event")
    if events[-1].get("type") not in TERMINAL_TYPES:
        problems.append("the events do not end with a terminal event")
    return problems


def attention_problems(event: dict, where: str, next_index: int, layers: object, read_for: object) -> list[str]:
    """What is wrong with one `attention` event: it must name the token that comes next (once), read
    positions 0 … query_position, and hold one entry per model layer whose top positions are cached ones."""
    problems = []
    index, positions, query = event.get("index"), event.get("positions"), event.get("query_position")
    if index == read_for:
        problems.append(f"{where} is a second attention event for token {index}")
    elif index != next_index:
        problems.append(f"{where} (attention) is for token {index}, expected one for token {next_index}")
    if not isinstance(positions, int) or query != positions - 1:
        problems.append(f"{where} (attention) must read positions 0 … query_position: positions = query_position + 1")
        return problems
    summaries = event.get("layers")
    if not isinstance(summaries, list) or (isinstance(layers, int) and len(summaries) != layers):
        problems.append(f"{where} (attention) must hold one entry per model layer ({layers})")
        return problems
    parts = [part for layer in summaries for part in (layer.values() if isinstance(layer, dict) else [None])]
    if not all(isinstance(t, dict) and top_in_range(t.get("top"), positions) for t in [event.get("all"), *parts]):
        problems.append(f"{where} (attention): every `top` must be [[position, weight], …] within 0 … {positions - 1}")
    return problems


def top_in_range(top: object, positions: int) -> bool:
    return isinstance(top, list) and all(
        isinstance(pair, list)
        and len(pair) == 2
        and isinstance(pair[0], int)
        and 0 <= pair[0] < positions
        and isinstance(pair[1], (int, float))
        for pair in top
    )


def dumps_trace(trace: dict) -> str:
    """The trace as JSON text: the head indented for reading, then one event per line without spaces
    (an `attention` event of a 30-layer model is ~13 kB compact; indented, ~2.7 times that)."""
    head = json.dumps({k: v for k, v in trace.items() if k != "events"}, ensure_ascii=False, indent=1)
    events = ",\n".join(json.dumps(e, ensure_ascii=False, separators=(",", ":")) for e in trace["events"])
    return f'{head[:-2]},\n "events": [\n{events}\n ]\n}}\n'


def machine_load(before: tuple[float, float, float], after: tuple[float, float, float]) -> dict:
    """Where and under what load a trace was recorded: the times in it are this machine's, and
    other work on its CPUs stretches them (the page shows this beside the recorded run)."""
    return {
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "load_1min_before": round(before[0], 2),
        "load_1min_after": round(after[0], 2),
    }


ROUTE_FIELDS = ("dtype_route", "weights_dtype", "quantization", "kv_dtype", "dtype_reason")


def route_of(facts: dict) -> dict:
    """The route a run was recorded on, as its model facts name it: the --dtype value that reproduces it,
    the weights' dtype, their quantization, the KV cache's dtype and why that route ran."""
    return {key: facts.get(key, "") for key in ROUTE_FIELDS}


def host_context() -> dict:
    """What else sets a recording's times: the CPU's vector capability (what `--dtype auto` routes by)
    and the machine's `uptime` line (its load over 1, 5 and 15 minutes) when the run ended."""
    import torch

    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "uptime": uptime_line()}


def uptime_line() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):  # no `uptime` here: the same three load averages
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def record(engine, request: dict = EXAMPLE_REQUEST, note: str | None = None) -> dict:
    """Runs `request` on a ready engine and returns the trace of that run, every event in arrival order."""
    from model_runner.protocol.request import parse_generate

    params = parse_generate(request)
    prompt = engine.describe_prompt(params)
    loads_before = os.getloadavg()
    events = [event.to_dict() for event in engine.submit(params, REQUEST_ID)]
    trace = {
        "format": FORMAT,
        "version": VERSION,
        "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "recorded_on": {
            **machine_load(loads_before, os.getloadavg()),
            **host_context(),
            "route": route_of(engine.facts.to_dict()),
        },
        "model": engine.facts.to_dict(),
        "request": request,
        "prompt": prompt,
        "events": events,
    }
    if note:
        trace["note"] = note
    return trace


def warm_up(engine, new_tokens: int = 8, request: dict = EXAMPLE_REQUEST) -> None:
    """One short request first, so the recording shows a running server, not first-call set-up costs
    (a fresh process's first decode steps are slow: one is not enough on the int4 route). Give it the
    request to be recorded, so an inspected recording warms the inspected path too."""
    from model_runner.protocol.request import parse_generate

    for _ in engine.submit(parse_generate({**request, "max_new_tokens": new_tokens}), "warm-up"):
        pass
