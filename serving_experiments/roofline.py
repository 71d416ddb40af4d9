"""The roofline: the machine's two ceilings, measured (a matmul's FLOP/s in the kernel the layers run,
a large copy's bytes/s), and each measured step placed under them by the cost model's FLOPs and bytes
(formulas/cost.py), with the roof it could reach, the share it reached and a verdict in words."""

from __future__ import annotations

import functools
import time
from typing import Any

from formulas import cost
from model_runner.loading.model_shape import shape_of

# A point reaching under half the roof above it is not held back by that roof: the rest of its time goes
# to launching kernels and bookkeeping. Half, because a kernel-bound step on a quiet machine reaches well
# over half of its ceiling (the matmul and copy are measured best-of-7), and a step at a quarter is
# spending three quarters of its time elsewhere.
HELD_BY_ROOF = 0.5
OVERHEAD = "below both roofs: overhead — launching and bookkeeping, not arithmetic or memory"
QUANTIZED_ROUTES = ("int4", "int8")


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _best_of(device, repeats: int, work) -> float:
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        work()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def copy_bandwidth(device, mib: int = 256, repeats: int = 7) -> dict[str, Any]:
    """Best-of-N copy of a large buffer into a second, already touched one; bytes read plus written."""
    import torch

    n = mib * 1024 * 1024 // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.zeros_like(src)  # both written once, so no page faults are timed
    best = _best_of(device, repeats, lambda: dst.copy_(src))
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
    best = _best_of(device, repeats, lambda: a @ b)
    return {
        "what": f"{n}x{n} {str(dtype).removeprefix('torch.')} matmul, best of {repeats}",
        "flops": 2 * n**3,
        "best_s": round(best, 6),
        "gflop_per_s": round(2 * n**3 / best / 1e9, 3),
    }


def kernel_rate(device, route: str, n: int = 1024, repeats: int = 7) -> dict[str, Any]:
    """Best-of-N of the int4 or int8 route's own weight kernel (model_runner/loading/quantize.py) on an
    n x n weight and n bfloat16 input rows: the compute ceiling of the layers as they run."""
    import torch

    from model_runner.loading.quantize import MM_DTYPE, Int4Linear, Int8Linear

    layer = (Int4Linear if route == "int4" else Int8Linear)(torch.randn(n, n))
    x = torch.randn(n, n).to(MM_DTYPE)
    layer(x)
    best = _best_of(device, repeats, lambda: layer(x))
    return {
        "what": f"{n}x{n} {route} weight kernel on {n} bfloat16 rows, best of {repeats}",
        "flops": 2 * n**3,
        "best_s": round(best, 6),
        "gflop_per_s": round(2 * n**3 / best / 1e9, 3),
    }


def compute_rate(device, route: str) -> dict[str, Any]:
    """The compute ceiling in the dtype the layers run: the route's kernel, or a matmul in its float dtype."""
    import torch

    if route in QUANTIZED_ROUTES:
        return kernel_rate(device, route)
    return matmul_rate(device, getattr(torch, route))


@functools.lru_cache(maxsize=8)
def ceilings(device: str, dtype: str) -> tuple[float, float]:
    """(FLOP/s, copy bytes/s) of this machine, measured once per process: `dtype` is the route the layers run
    (float32, bfloat16, float16, int4 or int8); the FLOP/s is that kernel's."""
    import torch

    dev = torch.device(device)
    return compute_rate(dev, dtype)["gflop_per_s"] * 1e9, copy_bandwidth(dev)["gb_per_s"] * 1e9


def verdict(intensity: float, share: float, ridge: float) -> str:
    """What holds a point back, from where it sits: the roof above it when it reaches HELD_BY_ROOF of it."""
    if share < HELD_BY_ROOF:
        return OVERHEAD
    return "memory-bound" if intensity < ridge else "compute-bound"


def point(flops: float, read: float, seconds: float, peak: float, bandwidth: float) -> dict[str, Any]:
    """One measured step: its intensity (FLOPs per byte read), FLOP/s achieved, the roof at that intensity,
    the share of it reached and the verdict."""
    intensity = flops / read
    achieved = flops / seconds
    attainable = cost.attainable_flops_s(intensity, peak, bandwidth)
    share = achieved / attainable
    return {
        "intensity": round(intensity, 3),
        "flops_s": round(achieved, 1),
        "attainable_flops_s": round(attainable, 1),
        "share": round(share, 6),
        "verdict": verdict(intensity, share, peak / bandwidth),
    }


def roofline(loaded, prefill: dict, decodes: list[dict]) -> dict:
    """Each measured step as a point under the machine's two ceilings: `prefill` is {tokens, ms}, each of
    `decodes` {batch, context, ms}; FLOPs and bytes from the loaded model's cost Shape, times as measured."""
    shape = shape_of(loaded)
    facts = loaded.facts
    peak, bandwidth = ceilings(facts.device, shape.route)
    tokens = prefill["tokens"]
    first = point(
        cost.prefill_flops(shape, tokens), cost.prefill_bytes(shape, tokens), prefill["ms"] / 1000, peak, bandwidth
    )
    points = [{"phase": "prefill", "tokens": tokens, **first}]
    for d in decodes:
        flops = d["batch"] * cost.decode_flops(shape, d["context"])
        read = cost.decode_step_bytes(shape, d["batch"], d["context"])
        points.append({"phase": "decode", "batch": d["batch"], **point(flops, read, d["ms"] / 1000, peak, bandwidth)})
    return {
        "peak_flops_s": round(peak, 1),
        "bandwidth_bytes_s": round(bandwidth, 1),
        "ridge_intensity": round(peak / bandwidth, 3),
        "route": shape.route,
        "held_by_roof": HELD_BY_ROOF,
        "points": points,
        "basis": f"peak measured on this machine in the kernel the layers run ({_peak_kernel(shape.route)}), "
        "bandwidth by a 256 MiB copy (bytes read + written); FLOPs and bytes computed by formulas/cost.py "
        f"from the model's {shape.route} shape; times measured in this run; a point reaching under "
        f"{HELD_BY_ROOF:.0%} of the roof above it is called overhead",
    }


def _peak_kernel(route: str) -> str:
    if route in QUANTIZED_ROUTES:
        return f"torch's {route} weight kernel with bfloat16 inputs"
    return f"a {route} matmul"
