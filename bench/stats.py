"""Distributions and the bench's JSON contract: percentiles (model_runner.metrics.percentile, the one definition),
the metric definitions printed with every table, and a hand-written checker for a small subset of
JSON Schema (type, properties, additionalProperties, required, items, enum, minimum) that the bench's output must pass."""

from __future__ import annotations

from typing import Any

from model_runner.fields import is_int, is_number
from model_runner.metrics import percentile

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


# ---- the output's schema ---------------------------------------------------------------------------

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
SCHEMA = {
    "type": "object",
    "required": [
        "kind",
        "version",
        "mode",
        "started_at",
        "duration_s",
        "command",
        "machine",
        "model",
        "settings",
        "definitions",
        "ceilings",
        "cells",
        "comparisons",
        "ratios",
        "kv_cache_off",
        "totals",
        "notes",
    ],
    "properties": {
        "kind": {"enum": ["kvscope-bench"]},
        "version": {"enum": [1]},
        "mode": {"enum": ["in-process", "websocket"]},
        "started_at": STR,
        "duration_s": NUM,
        "command": STR,
        "machine": {"type": "object"},
        "model": {"type": "object", "required": ["name", "params", "weights_bytes", "kv_bytes_per_token"]},
        "settings": {"type": "object", "required": ["prompt_lens", "output_lens", "concurrency", "repeats"]},
        "definitions": {"type": "object"},
        "ceilings": {
            "type": "object",
            "required": ["copy_gb_per_s", "matmul_gflop_per_s"],
            "properties": {"copy_gb_per_s": NUM, "matmul_gflop_per_s": NUM},
        },
        "cells": {"type": "array", "items": CELL},
        "comparisons": {"type": "array", "items": COMPARISON},
        "ratios": {"type": "object", "additionalProperties": RATIO},
        "kv_cache_off": {"type": ["object", "null"]},
        "totals": TOTALS,
        "notes": {"type": "array", "items": STR},
    },
}

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is(value: Any, kind: str) -> bool:
    if kind == "integer":
        return is_int(value)
    if kind == "number":
        return is_number(value)
    return isinstance(value, _TYPES[kind])


def validate(value: Any, schema: dict = SCHEMA, path: str = "$") -> list[str]:
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
