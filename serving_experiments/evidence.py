"""A verdict needs its evidence: the checks a roofline's measured floors pass before any verdict is drawn from
them (each floor below the fastest step it bounds; the kernels' floors of decode steps non-decreasing in rows),
and whether one point's verdict is carried (floors consistent, enough steps, the same at its fastest and its
median step). The page's twin is static/js/shared/evidence.js; both read tests/data/evidence-cases.json."""

from __future__ import annotations

from typing import Any

# A floor more rows need may come out this much below the floor of fewer rows before it counts as falling:
# two timings of the same weights read differ by this much on a quiet machine (the chapter's "about the same").
FLOOR_SLACK = 0.05
# The fewest measured steps a verdict rests on: with one or two, the median is the fastest or half of it.
MIN_STEPS = 3

CARRIED, FLOORS, LOADED, FEW_STEPS, NO_MEDIAN, MIXED = "carried", "floors", "loaded", "few steps", "no median", "mixed"


def _rows(point: dict) -> int:
    return point.get("rows") or point.get("batch") or point.get("tokens") or 0


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and x == x and abs(x) != float("inf")


def floor_problems(points: list[dict]) -> list[dict]:
    """What is wrong with a roofline's floors, in order: {"kind": "above step", "phase", "rows"} for a floor
    (kernel_ms) not below its step (step_ms, the fastest), and {"kind": "falls", "phase", "rows", "after"}
    for a decode floor more than FLOOR_SLACK below the floor of the fewer rows `after`. [] = consistent."""
    timed = [p for p in points if _finite(p.get("kernel_ms")) and _finite(p.get("step_ms"))]
    problems = [
        {"kind": "above step", "phase": p["phase"], "rows": _rows(p)} for p in timed if p["kernel_ms"] >= p["step_ms"]
    ]
    decodes = sorted((p for p in timed if p["phase"] == "decode"), key=_rows)
    for before, p in zip(decodes, decodes[1:]):
        if p["kernel_ms"] < before["kernel_ms"] * (1 - FLOOR_SLACK):
            problems.append({"kind": "falls", "phase": "decode", "rows": _rows(p), "after": _rows(before)})
    return problems


def problem_words(problem: dict, points: list[dict]) -> str:
    """One floor problem in words, with the figures it is about."""
    at = {(p["phase"], _rows(p)): p for p in points}
    p = at[(problem["phase"], problem["rows"])]
    name = f"{problem['phase']} at {problem['rows']} row{'s' if problem['rows'] != 1 else ''}"
    if problem["kind"] == "above step":
        return f"the floor of the {name} ({p['kernel_ms']:.2f} ms) is not below its step ({p['step_ms']:.2f} ms)"
    before = at[("decode", problem["after"])]
    return (
        f"the floor of the {name} ({p['kernel_ms']:.2f} ms) is below the floor at {problem['after']} "
        f"row{'s' if problem['after'] != 1 else ''} ({before['kernel_ms']:.2f} ms)"
    )


def loaded(load_1m: float | None, threads: int | None) -> bool:
    """Whether the machine ran more runnable work than the steps' threads (its 1-minute load above them): its
    step times then measure the other processes' share of the CPUs more than the steps themselves."""
    return _finite(load_1m) and _finite(threads) and load_1m > threads


def point_evidence(point: dict, floors_consistent: bool, machine_loaded: bool = False) -> str:
    """Whether one point's verdict is carried, else why not: FLOORS (the roofline's floors failed their check),
    LOADED (the machine was loaded past its threads while it ran), FEW_STEPS (fewer than MIN_STEPS steps
    measured), NO_MEDIAN (no verdict at its median step), MIXED (the verdicts at its fastest and its median
    step differ); CARRIED otherwise."""
    if not floors_consistent:
        return FLOORS
    if machine_loaded:
        return LOADED
    if not (point.get("steps_measured") or 0) >= MIN_STEPS:
        return FEW_STEPS
    if not point.get("held_by_median"):
        return NO_MEDIAN
    return CARRIED if point["held_by_median"] == point.get("held_by") else MIXED


def check(points: list[dict], load_1m: float, threads: int) -> dict:
    """The floors' check run live on a roofline, each point's `evidence` set in place: a point whose floors fail
    it, measured on a machine loaded past its threads, or whose verdict differs at its median step, has its
    verdict marked not carried. → the fields the roofline's answer carries about it."""
    problems = floor_problems(points)
    for p in points:
        p["evidence"] = point_evidence(p, not problems, loaded(load_1m, threads))
    words = [problem_words(q, points) for q in problems]
    return {"floors_consistent": not problems, "floor_problems": words, "load_1m": load_1m, "threads": threads}
