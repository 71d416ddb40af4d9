"""The roofline per kernel that ran: each measured step is set beside the time its own kernels take alone
(every decoder layer's projections in turn as the model calls them at the step's row count, plus the head;
float32 GEMM for a prompt of FLOAT_ROWS rows or more where the route keeps float32 copies for prompts, else
the route's own kernel at any rows) and the time its bytes take at the copy bandwidth; the larger of the two
is the step's floor, checked live against the step (serving_experiments/evidence.py), and the verdict says
which of them, or neither (overhead), holds it back. FLOPs and bytes are formulas/cost.py's."""

from __future__ import annotations

import functools
from typing import Any

from formulas import cost
from model_runner.loading.model_shape import shape_of
from serving_experiments import evidence
from serving_experiments.kernels import REPEATS, Kernels, best_of

# A step whose floor (its kernels alone, or its bytes at the copy bandwidth) fills under half of its time
# is not held back by either: the rest of its time goes to launching operations and bookkeeping. Half,
# because a step that spends more than half its time outside its kernels is mostly doing something else.
HELD_BY_ROOF = 0.5
QUANTIZED_ROUTES = ("int4", "int8")
GEMM_ROWS = (64, 256, 1024)  # the float32 GEMM's own peak on this model's shapes: prompt sizes well past a prompt's


def copy_bandwidth(device, mib: int = 256, repeats: int = 7) -> dict[str, Any]:
    """Best-of-N copy of a large buffer into a second, already touched one; bytes read plus written."""
    import torch

    n = mib * 1024 * 1024 // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.zeros_like(src)  # both written once, so no page faults are timed
    best = best_of(device, repeats, lambda: dst.copy_(src))
    moved = 2 * src.nbytes
    return {
        "what": f"copy of a {mib} MiB buffer, best of {repeats}; bytes read + bytes written",
        "bytes": moved,
        "best_s": round(best, 6),
        "gb_per_s": round(moved / best / 1e9, 3),
    }


def matmul_rate(device, dtype, n: int = 1024, repeats: int = 7) -> dict[str, Any]:
    """Best-of-N square matmul in `dtype` (a torch dtype): 2n^3 floating-point operations."""
    import torch

    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    a @ b  # first call pays for kernel selection and allocation
    best = best_of(device, repeats, lambda: a @ b)
    return {
        "what": f"{n}x{n} {str(dtype).removeprefix('torch.')} matmul, best of {repeats}",
        "flops": 2 * n**3,
        "best_s": round(best, 6),
        "gflop_per_s": round(2 * n**3 / best / 1e9, 3),
    }


def kernel_rate(device, route: str, n: int = 1024, repeats: int = 7) -> dict[str, Any]:
    """Best-of-N of the int4 or int8 route's own weight kernel (model_runner/loading/quantize.py) on an
    n x n weight and n bfloat16 input rows (the bench's ceiling; the roofline times the model's own layers)."""
    import torch

    from model_runner.loading.quantize import MM_DTYPE, Int4Linear, Int8Linear

    layer = (Int4Linear if route == "int4" else Int8Linear)(torch.randn(n, n))
    x = torch.randn(n, n).to(MM_DTYPE)
    layer(x)
    best = best_of(device, repeats, lambda: layer(x))
    return {
        "what": f"{n}x{n} {route} weight kernel on {n} bfloat16 rows, best of {repeats}",
        "flops": 2 * n**3,
        "best_s": round(best, 6),
        "gflop_per_s": round(2 * n**3 / best / 1e9, 3),
    }


def compute_rate(device, route: str) -> dict[str, Any]:
    """A compute rate in the dtype the layers run (the bench's): the route's kernel, or a matmul in its float dtype."""
    import torch

    if route in QUANTIZED_ROUTES:
        return kernel_rate(device, route)
    return matmul_rate(device, getattr(torch, route))


@functools.lru_cache(maxsize=8)
def ceilings(device: str, dtype: str) -> tuple[float, float]:
    """(FLOP/s, copy bytes/s) of this machine, measured once per process (the bench's and the attention-cost
    floor's): `dtype` is the route the layers run; the FLOP/s is that kernel's at 1,024 rows."""
    import torch

    dev = torch.device(device)
    return compute_rate(dev, dtype)["gflop_per_s"] * 1e9, copy_bandwidth(dev)["gb_per_s"] * 1e9


# ---- the kernels a step runs --------------------------------------------------------------------------


def kernel_name(route: str, rows: int, decode: bool, float_prefill: bool) -> str:
    """The kernel a call of `rows` rows runs on this route, in words (quantize.py's rule: only a route that keeps
    float32 copies for prompts, `float_prefill`, runs a prompt's FLOAT_ROWS rows or more on them; int8, and
    int4 without the copies, run every call on the route's kernel; a decode step stays there at any width)."""
    if route not in QUANTIZED_ROUTES:
        return f"{route} GEMM"
    if float_prefill and not decode and rows >= cost.FLOAT_ROWS:
        return "float32 GEMM"
    return f"{route} kernel"


# ---- judging a point ------------------------------------------------------------------------------------


def kernels_text(route: str, rows: int, decode: bool, float_prefill: bool) -> str:
    """The kernels a step ran, in words: the layers' kernel at its rows and the head's pass at its logits rows."""
    layers = f"the {kernel_name(route, rows, decode, float_prefill)} at {rows} row{'s' if rows != 1 else ''}"
    head_rows = rows if decode else 1
    if route not in QUANTIZED_ROUTES:
        return f"{layers} and the head"
    return f"{layers} and the head's int8 pass at {head_rows} row{'s' if head_rows != 1 else ''}"


def verdict(held_by: str, kernel: str) -> str:
    """The verdict in words, from what holds the step back (the larger floor, if it fills HELD_BY_ROOF)."""
    if held_by == "overhead":
        return "overhead: the step's own kernels and its bytes fill under half of it"
    if held_by == "memory":
        return "memory-bound: its bytes at the copy bandwidth take longer than its kernels and fill at least half of the step"
    if held_by == "kernel-streaming":
        return f"held by the {kernel}, which reads its weights at half the copy bandwidth or more: near memory speed"
    if kernel.startswith(QUANTIZED_ROUTES):
        return f"held by the {kernel}'s arithmetic (unpacking its weights and the dot products), not by memory"
    return f"compute-bound: held by the {kernel}"


def judge(
    flops: float, read: float, step_s: float, kernel_s: float, bandwidth: float, kernel: str, weights: float
) -> dict:
    """A measured step against its two floors: its kernels alone (kernel_s, measured) and its bytes at the copy
    bandwidth (computed); the step's ceiling is its FLOPs over the larger floor and its share that floor over
    its time. What holds it back: nothing it measures when the floor fills under HELD_BY_ROOF of the step
    (overhead); memory when its bytes take longer than its kernels; else its kernels: "kernel-streaming" when
    they read the `weights` at HELD_BY_ROOF of the copy bandwidth or more, else their own arithmetic ("kernel")."""
    memory_s = read / bandwidth
    floor_s = max(kernel_s, memory_s)
    share = floor_s / step_s
    streamed = weights / kernel_s / bandwidth  # the kernels' bytes a second, as a share of a plain copy's
    if share < HELD_BY_ROOF:
        held_by = "overhead"
    elif memory_s >= kernel_s:
        held_by = "memory"
    elif streamed >= HELD_BY_ROOF:  # the kernels are the longer floor, but read near memory speed
        held_by = "kernel-streaming"
    else:
        held_by = "kernel"
    return {
        "intensity": round(flops / read, 3),
        "flops_s": round(flops / step_s, 1),
        "attainable_flops_s": round(flops / floor_s, 1),
        "step_ms": round(step_s * 1000, 3),
        "kernel_ms": round(kernel_s * 1000, 3),
        "memory_ms": round(memory_s * 1000, 3),
        "kernel_bandwidth_share": round(streamed, 6),
        "kernel": kernel,
        "share": round(share, 6),
        "held_by": held_by,
        "verdict": verdict(held_by, kernel),
    }


def _weights_read(shape, rows: int, decode: bool) -> int:
    """The weight bytes a call of `rows` rows reads, the head's logits rows included (one for a prompt)."""
    return cost.weight_bytes_read(shape, rows, rows if decode else 1, decode=decode)


def roofline(loaded, prefill: dict, decodes: list[dict]) -> dict:
    """Each measured step under the ceilings of the kernels that ran it: `prefill` is {tokens, ms}, each of
    `decodes` {batch, context, ms}, both with their median `ms_median` over `steps` measured where known;
    FLOPs and bytes from the loaded model's cost Shape, times as measured; the floors checked as they come."""
    shape = shape_of(loaded)
    _, bandwidth = ceilings(loaded.facts.device, shape.route)
    kernels = Kernels(loaded)
    tokens = prefill["tokens"]
    batches = [d["batch"] for d in decodes]
    calls = [("layers", tokens, False), ("head", 1, False)]
    calls += [("gemm", r, False) for r in GEMM_ROWS]
    calls += [(part, b, True) for b in batches for part in ("layers", "head")]
    timed = kernels.measure(calls)

    prefill_kernel = kernel_name(shape.route, tokens, False, shape.float_prefill)
    prefill_figures = (
        cost.prefill_flops(shape, tokens),
        cost.prefill_bytes(shape, tokens),
        timed[("layers", tokens, False)] + timed[("head", 1, False)],
        bandwidth,
        prefill_kernel,
        _weights_read(shape, tokens, decode=False),
    )
    flops, read, *rest = prefill_figures
    first = judge(flops, read, prefill["ms"] / 1000, *rest)
    first["kernels"] = kernels_text(shape.route, tokens, False, shape.float_prefill)
    first.update(_at_median(prefill, *prefill_figures))
    points = [{"phase": "prefill", "tokens": tokens, "rows": tokens, **first}]
    for d in decodes:
        b = d["batch"]
        flops = b * cost.decode_flops(shape, d["context"])
        read = cost.decode_step_bytes(shape, b, d["context"])
        kernel_s = timed[("layers", b, True)] + timed[("head", b, True)]
        kernel = kernel_name(shape.route, b, True, shape.float_prefill)
        weights = _weights_read(shape, b, decode=True)
        p = judge(flops, read, d["ms"] / 1000, kernel_s, bandwidth, kernel, weights)
        p["kernels"] = kernels_text(shape.route, b, True, shape.float_prefill)
        p.update(_at_median(d, flops, read, kernel_s, bandwidth, kernel, weights))
        points.append({"phase": "decode", "batch": b, "rows": b, **p})
    floors = _check_floors(points)

    gemm = {
        r: kernels.layer_flops(r) / timed[("layers" if r == tokens else "gemm", r, False)] for r in (tokens, *GEMM_ROWS)
    }
    gemm_kernel = kernel_name(shape.route, max(GEMM_ROWS), False, shape.float_prefill)
    peak = max(gemm.values())
    return {
        "peak_flops_s": round(peak, 1),
        "peak_kernel": f"{gemm_kernel} on this model's layers, the best of {_rows_list(sorted(gemm))} rows",
        "gemm_flops_s": {str(r): round(v, 1) for r, v in sorted(gemm.items())},
        "bandwidth_bytes_s": round(bandwidth, 1),
        "ridge_intensity": round(peak / bandwidth, 3),
        "route": shape.route,
        "held_by_roof": HELD_BY_ROOF,
        **floors,
        "points": points,
        "basis": "each step against its own kernels, measured on the machine that ran it: the projections of all "
        f"{kernels.layers} decoder layers in turn, as the model calls them at the step's rows (the int4 siblings in "
        f"their one joined call), plus the head, best of {REPEATS} interleaved rounds on the step's threads (a "
        "lower bound: the step runs these calls and its attention, norms and bookkeeping besides), checked live: "
        "each floor below its step and no floor falling as rows grow, else no verdict is drawn; "
        f"{route_rule(shape.route, shape.float_prefill)}; bandwidth by a 256 MiB copy (bytes read + "
        "written); FLOPs and bytes computed by formulas/cost.py; a step whose larger floor (its kernels alone, "
        f"or its bytes at that bandwidth) fills under {HELD_BY_ROOF:.0%} of it is called overhead",
    }


def _at_median(step: dict, flops, read, kernel_s, bandwidth, kernel, weights) -> dict:
    """The same step (`step`: {ms, ms_median, steps}) judged at its median time, and how many steps it was
    measured over: a verdict is carried only where it holds at both (serving_experiments/evidence.py)."""
    if not step.get("ms_median"):
        return {"steps_measured": step.get("steps", 1)}
    median = judge(flops, read, step["ms_median"] / 1000, kernel_s, bandwidth, kernel, weights)
    return {
        "step_ms_median": median["step_ms"],
        "share_median": median["share"],
        "held_by_median": median["held_by"],
        "steps_measured": step.get("steps", 1),
    }


def _check_floors(points: list[dict]) -> dict:
    """The floors' check and each point's evidence (evidence.check), at the load and threads of this moment."""
    import os

    import torch

    return evidence.check(points, round(os.getloadavg()[0], 2), torch.get_num_threads())


def _rows_list(rows: list[int]) -> str:
    words = [f"{r:,}" for r in rows]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def route_rule(route: str, float_prefill: bool) -> str:
    """Which kernels ran which step on this route, in words (kernel_name's rule), for the roofline's basis."""
    if route not in QUANTIZED_ROUTES:
        return f"every step on the {route} weights"
    if float_prefill:
        return (
            f"a prompt of {cost.FLOAT_ROWS} rows or more on the float32 weights (float32 GEMM), "
            f"a decode step on the {route} kernel and the head's int8 pass at the batch's rows"
        )
    return (
        f"every step on the {route} kernel, a prompt's too (no float32 copies kept for prompts), "
        "and the head's int8 pass at a prompt's one row or a decode batch's rows"
    )
