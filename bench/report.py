"""The reporting floor every benchmark's output passes through: the metric definitions printed with every
table, distributions (model_runner.protocol.metrics.percentile, the one definition), every request counted by
outcome, ratios judged against their targets (met or missed, never asserted), greedy answers compared
token for token, the JSON contract's pieces with a hand-written checker for a small subset of JSON Schema
(type, properties, additionalProperties, required, items, enum, minimum), the file written only when it
passes, and the lines every printed report shares."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, TextIO

from model_runner.protocol.fields import is_int, is_number
from model_runner.protocol.metrics import percentile

from .clients import RequestRecord

# vLLM `bench serve` definitions, measured at the client (the thread or socket that reads events).
DEFINITIONS = {
    "queue_ms": "submit -> prefill start, as the engine stamps them (time spent waiting for the model)",
    "ttft_ms": "time to first token: request sent -> first token event received",
    "tpot_ms": "time per output token: (E2E - TTFT) / (output tokens - 1), per request",
    "itl_ms": "inter-token latency: every gap between consecutive token events received, pooled over requests",
    "e2e_ms": "end-to-end latency: request sent -> its terminal event received",
    "delivery_ms": "token event stamped by the engine -> received by the client (over a WebSocket an upper "
    "bound: it also holds the generate frame's trip to the server)",
    "delivery_lower_ms": "over a WebSocket, a lower bound: delivery less the `accepted` event's own lag "
    "(in-process the same as delivery, which is exact there)",
}
METRICS = ("queue_ms", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")


def describe(values: list[float]) -> dict[str, Any]:
    """n, mean, p50, p90, p95, p99, min and max (None when there are no values), rounded to 0.001."""

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    return {
        "n": len(values),
        "mean": r(sum(values) / len(values)) if values else None,
        "p50": r(percentile(values, 50)),
        "p90": r(percentile(values, 90)),
        "p95": r(percentile(values, 95)),
        "p99": r(percentile(values, 99)),
        "min": r(min(values)) if values else None,
        "max": r(max(values)) if values else None,
    }


def spread(values: list[float]) -> dict[str, Any]:
    """A ratio over repetitions: its median with min and max, as printed `1.02x [0.99-1.05]`."""
    return {
        "n": len(values),
        "median": round(percentile(values, 50), 4) if values else None,
        "min": round(min(values), 4) if values else None,
        "max": round(max(values), 4) if values else None,
    }


def latency_samples(records: list) -> dict[str, list[float]]:
    """Every request's queue, TTFT, TPOT and E2E, and every inter-token gap, pooled over `records`
    (the ones a request did not produce are left out)."""
    return {
        "queue_ms": [r.queue_ms for r in records if r.queue_ms is not None],
        "ttft_ms": [r.ttft_ms for r in records if r.ttft_ms is not None],
        "tpot_ms": [r.tpot_ms for r in records if r.tpot_ms is not None],
        "itl_ms": [x for r in records for x in r.itl_ms],
        "e2e_ms": [r.e2e_ms for r in records if r.e2e_ms is not None],
    }


# ---- counted and judged -------------------------------------------------------------------------


def totals(records: list[RequestRecord]) -> dict[str, Any]:
    """Every request counted by outcome; `reasons` counts finish reasons, cancel causes and error codes."""
    outcomes = [r.outcome for r in records]
    reasons: dict[str, int] = {}
    for r in records:
        key = f"{r.outcome}:{r.reason}"
        reasons[key] = reasons.get(key, 0) + 1
    return {
        "requests": len(records),
        "completed": outcomes.count("completed"),
        "timeouts": outcomes.count("timeout"),
        "cancelled": outcomes.count("cancelled"),
        "errors": outcomes.count("error"),
        "reasons": reasons,
    }


def judged(
    text: str, values: dict, value: float | None, goal: tuple[str, float] | None, lower: float | None = None
) -> dict:
    """A ratio beside its goal ("max" or "min", target). With bounds (delivery over a socket) it is
    met when the upper bound meets the target, missed when even the lower bound misses it, and
    undecided between."""
    direction, target = goal or (None, None)
    lower = value if lower is None else lower
    met = None
    if target is not None and value is not None:
        meets = (lambda x: x <= target) if direction == "max" else (lambda x: x >= target)
        met = True if meets(value) else False if not meets(lower) else None

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 4)

    return {
        "what": text,
        "target": target,
        "direction": direction,
        "value": r(value),
        "value_lower": r(lower),
        "spread": values,
        "met": met,
    }


def run_summary(records: list[RequestRecord], wall: float, counters: dict) -> dict:
    """One run of a set of requests: tokens/s = output tokens of the completed ones / (first send ->
    last terminal event), with the engine's own counters over the run."""
    ok = [r for r in records if r.outcome == "completed"]
    tokens = sum(len(r.token_ids) for r in ok)
    return {
        "requests": len(records),
        "completed": len(ok),
        "output_tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 3) if wall > 0 and tokens else None,
        **counters,
        "totals": totals(records),
    }


def outputs(records: list[RequestRecord]) -> list[list[int] | None]:
    return [r.token_ids if r.outcome == "completed" else None for r in records]


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first token index where two answers differ (a length difference counts), None when equal."""
    index = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return None if index == len(a) == len(b) else index


def greedy_equality(got: list[list[int] | None], reference: list[list[int] | None]) -> dict:
    """Request by request: how many of the pairs that both completed are token-for-token identical,
    and where the others first differ (token index)."""
    identical, compared, diffs = 0, 0, []
    for i, (a, b) in enumerate(zip(got, reference)):
        if a is None or b is None:
            continue
        compared += 1
        first = first_difference(a, b)
        if first is None:
            identical += 1
        else:
            diffs.append({"request": i, "token": first})
    return {"identical": identical, "compared": compared, "first_diff": diffs}


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


# ---- the output's contract ----------------------------------------------------------------------

NUM = {"type": "number"}
OPT_NUM = {"type": ["number", "null"]}
INT = {"type": "integer", "minimum": 0}
STR = {"type": "string"}
OPT_STR = {"type": ["string", "null"]}
DIST = {
    "type": "object",
    "required": ["n", "mean", "p50", "p90", "p95", "p99", "min", "max"],
    "properties": {"n": INT, **{k: OPT_NUM for k in ("mean", "p50", "p90", "p95", "p99", "min", "max")}},
}
SPREAD = {
    "type": "object",
    "required": ["n", "median", "min", "max"],
    "properties": {"n": INT, "median": OPT_NUM, "min": OPT_NUM, "max": OPT_NUM},
}
TOTALS = {
    "type": "object",
    "required": ["requests", "completed", "timeouts", "cancelled", "errors", "reasons"],
    "properties": {
        "requests": INT,
        "completed": INT,
        "timeouts": INT,
        "cancelled": INT,
        "errors": INT,
        "reasons": {"type": "object"},
    },
}
REQUEST = {
    "type": "object",
    "required": ["request_id", "outcome", "reason", "prompt_tokens", "output_tokens", "ttft_ms", "e2e_ms", "itl_ms"],
    "properties": {
        "request_id": STR,
        "outcome": {"enum": ["completed", "timeout", "cancelled", "error"]},
        "reason": OPT_STR,
        "prompt_tokens": {"type": ["integer", "null"]},
        "output_tokens": INT,
        "ttft_ms": OPT_NUM,
        "e2e_ms": OPT_NUM,
        "itl_ms": {"type": "array", "items": NUM},
    },
}
RATIO = {
    "type": "object",
    "required": ["what", "target", "direction", "value", "value_lower", "spread", "met"],
    "properties": {
        "what": STR,
        "target": OPT_NUM,
        "direction": {"enum": ["max", "min", None]},
        "value": OPT_NUM,
        "value_lower": OPT_NUM,
        "spread": SPREAD,
        "met": {"type": ["boolean", "null"]},
    },
}


def report_schema(kind: str, modes: list[str], model: list[str], settings: list[str], **parts: dict) -> dict:
    """A benchmark report's contract: the header every report has (what ran, when, with which command, on
    which machine and model, with which settings), the benchmark's own `parts`, then the judged ratios,
    every request counted and the notes."""
    properties = {
        "kind": {"enum": [kind]},
        "version": {"enum": [1]},
        "mode": {"enum": modes},
        "started_at": STR,
        "duration_s": NUM,
        "command": STR,
        "machine": {"type": "object"},
        "model": {"type": "object", "required": model},
        "settings": {"type": "object", "required": settings},
        **parts,
        "ratios": {"type": "object", "additionalProperties": RATIO},
        "totals": TOTALS,
        "notes": {"type": "array", "items": STR},
    }
    return {"type": "object", "required": list(properties), "properties": properties}


_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is(value: Any, kind: str) -> bool:
    if kind == "integer":
        return is_int(value)
    if kind == "number":
        return is_number(value)
    return isinstance(value, _TYPES[kind])


def validate(value: Any, schema: dict, path: str = "$") -> list[str]:
    """Every way `value` breaks `schema`, as 'path: problem' lines (empty when it conforms)."""
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_is(value, k) for k in kinds):
            return [f"{path}: expected {' or '.join(kinds)}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{path}: {value!r} is not one of {schema['enum']}"]
    problems: list[str] = []
    if "minimum" in schema and _is(value, "number") and value < schema["minimum"]:
        problems.append(f"{path}: {value} < minimum {schema['minimum']}")
    if isinstance(value, dict):
        problems += [f"{path}: missing {key!r}" for key in schema.get("required", []) if key not in value]
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                problems += validate(value[key], sub, f"{path}.{key}")
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in value.keys() - schema.get("properties", {}).keys():
                problems += validate(value[key], extra, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            problems += validate(item, schema["items"], f"{path}[{i}]")
    return problems


def write_json(report: dict, path: str | None, started_at: datetime, schema: dict | None, name: str) -> Path:
    """The report as `path` (default NAME-YYYYMMDD-HHMMSS.json), checked against `schema` first."""
    problems = validate(report, schema) if schema else []
    if problems:  # a bug in the bench, not in the engine: say so rather than write a broken file
        raise RuntimeError("bench output does not match its schema:\n  " + "\n  ".join(problems[:20]))
    target = Path(path or f"{name}-{started_at.strftime('%Y%m%d-%H%M%S')}.json")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(report, indent=1, allow_nan=False) + "\n")
    return target


def finish(
    report: dict,
    json_path: str | None,
    started_at: datetime,
    show: Callable[[dict, TextIO], None],
    out: TextIO,
    schema: dict | None = None,
    name: str = "bench",
) -> int:
    """Print (`show`), then write. Exit code 1 when a request ended in an error (the numbers are still written)."""
    show(report, out)
    print(f"\nwrote {write_json(report, json_path, started_at, schema, name)}", file=out)
    return 1 if (report.get("totals") or {}).get("errors") else 0


# ---- the printed lines every report shares -------------------------------------------------------


def fmt_num(x: float | None, digits: int = 1) -> str:
    """A number for the tables, thousands separated; "-" when unknown."""
    return "-" if x is None else f"{x:,.{digits}f}"


def fmt_ratio(spread: dict, digits: int = 2) -> str:
    """A ratio's median with its min-max over the repeats, as 1.23x [1.10-1.40]."""
    if spread["median"] is None:
        return "-"
    return f"{spread['median']:.{digits}f}x [{spread['min']:.{digits}f}-{spread['max']:.{digits}f}]"


def print_head(title: str, report: dict, out: TextIO) -> None:
    """A report's first lines: what ran (`title`), the machine and its load at the start and the end, the command."""
    machine = report["machine"]
    start, end = machine.get("load_average_start"), machine.get("load_average_end")
    load = f"; load average {start[0]:.2f} at the start, {end[0]:.2f} at the end" if start and end else ""
    print(title, file=out)
    print(
        f"machine: {machine['platform']}, {machine['cpu_count']} CPUs, {machine['torch_threads']} torch threads{load}",
        file=out,
    )
    print(f"command: {report['command']}", file=out)


def goal_text(ratio: dict) -> str:
    """A judged ratio's target as `<= 1.03` or `>= 2.5`; empty when it has none."""
    return "" if ratio["target"] is None else f"{'<=' if ratio['direction'] == 'max' else '>='} {ratio['target']:g}"


def verdict_text(ratio: dict, undecided: str = "") -> str:
    return {True: "met", False: "MISSED", None: undecided}[ratio["met"]]


def print_footer(report: dict, out: TextIO, noun: str = "requests", reasons: bool = False) -> None:
    """Every request counted by outcome (with the reasons of those that did not complete), then the notes."""
    t = report["totals"]
    line = f"\nTotals: {t['requests']} {noun}: {t['completed']} completed, {t['timeouts']} timeouts, "
    line += f"{t['cancelled']} cancelled, {t['errors']} errors"
    if reasons and t["requests"] > t["completed"]:
        line += f" ({', '.join(f'{k} x{v}' for k, v in sorted(t['reasons'].items()) if not k.startswith('completed'))})"
    print(line, file=out)
    for note in report["notes"]:
        print(f"note: {note}", file=out)
