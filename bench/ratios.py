"""What a run adds up to: every request counted by outcome, and each ratio's median and spread over
the repetitions judged against the issue's targets (reported as met or missed, never asserted)."""

from __future__ import annotations

from typing import Any

from model_runner.metrics import percentile

from .clients import RequestRecord
from .stats import spread

TARGETS = {  # benchmark targets from the issue; reported as met or missed, never asserted
    "engine_step_over_bare": ("max", 1.03),
    "engine_tps_over_generate": ("min", 1.10),
    "delivery_p95_ms": ("max", 30.0),
}


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


def ratio_report(
    comparisons: list[dict], cells: list[dict], delivery: tuple[list[float], list[float]], mode: str
) -> dict[str, dict]:
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
        text = (
            "token event stamped by the engine -> received over the WebSocket, p95 in ms "
            "(upper bound; lower bound beside it)"
        )
        report["delivery_p95_ms"] = _judged("delivery_p95_ms", text, per_cell, upper, lower)
    else:
        text = "token event stamped by the engine -> read by the in-process client thread, p95 in ms"
        report["delivery_p95_ms"] = _judged("", text, per_cell, upper, upper)
    return report


def _judged(key: str, text: str, values: dict, value: float | None, lower: float | None = None) -> dict:
    return judged(text, values, value, TARGETS.get(key), lower)


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


# ---- continuous batching: runs of a set of requests, and their outputs compared -----------------


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
