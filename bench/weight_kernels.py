"""Torch's CPU weight kernels side by side on the bundled model's own decode calls: each kernel runs a step's
projections (q|k|v, o, gate|up and down joined as the native step calls them, every layer on weights of its
own, so they come from memory as in a step, not from a cache) at a row count, in interleaved rounds; → each
kernel's median time a step and its ratio to the int4 kernel the default route runs, with the machine's facts.
Which kernel a CPU runs fastest is a per-CPU fact (docs/performance.md): this is how to find it out.

    .venv/bin/python -m bench.weight_kernels [--rows 1] [--rounds 7] [--threads N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from time import perf_counter

import torch
from torch import nn

from bench.measure import kernel_facts, load_average
from model_runner.loading.packed import pack, packed_linear
from model_runner.loading.quantize import Int4Linear, Int8Linear, int4_mm

# The bundled model's (SmolLM2-135M) decode calls a layer, (inputs, outputs): q|k|v, o, gate|up, down.
SMOLLM2_CALLS = ((576, 960), (576, 576), (576, 3072), (1536, 576))
SMOLLM2_LAYERS = 30

Kernel = Callable[[torch.Tensor], torch.Tensor]  # x [rows, in] float32 → y [rows, out] float32


@dataclass(frozen=True)
class WeightKernel:
    """One way to hold a weight and multiply by it: `prepare(weight [out, in] float32)` → (kernel, bytes held)."""

    name: str
    what: str
    prepare: Callable[[torch.Tensor], tuple[Kernel, int]]
    available: Callable[[], bool] = lambda: True


def _bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _int4(weight):
    layer = Int4Linear(weight)
    return (lambda x: int4_mm(x, layer.weight, layer.scales_zeros, x.dtype)), _bytes(layer.weight, layer.scales_zeros)


def _int8(weight):
    layer = Int8Linear(weight)
    return layer.forward, _bytes(layer.weight, layer.scales)


def _dynamic_engine() -> str | None:
    """The quantized engine with x86's int8 GEMMs in this torch build (x86, else fbgemm), or None."""
    engines = torch.backends.quantized.supported_engines
    return next((name for name in ("x86", "fbgemm") if name in engines), None)


def _dynamic_int8(weight):
    scales = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12)
    zeros = torch.zeros(weight.shape[0], dtype=torch.long)
    engine, torch.backends.quantized.engine = torch.backends.quantized.engine, _dynamic_engine()
    try:  # the packed weight keeps the engine it was packed for; the process's choice is put back
        with warnings.catch_warnings():  # torch.ao's quantization API is marked deprecated, not removed
            warnings.simplefilter("ignore")
            quantized = torch.quantize_per_channel(weight, scales, zeros, 0, torch.qint8)
            packed = torch.ops.quantized.linear_prepack(quantized, None)
    finally:
        torch.backends.quantized.engine = engine
    # reduce_range: the inputs are rounded to 7 of their 8 bits (against overflow in 8-bit multiply-adds without VNNI)
    return (lambda x: torch.ops.quantized.linear_dynamic(x, packed, True)), weight.numel() + _bytes(scales)


def _half(dtype: torch.dtype):
    def prepare(weight):
        held = weight.to(dtype)
        return (lambda x: nn.functional.linear(x.to(dtype), held).float()), _bytes(held)

    return prepare


def _float32(weight):
    packed = pack(weight)
    return (lambda x: packed_linear(x, packed, None)), _bytes(weight)


KERNELS = (
    WeightKernel(
        "int4", "torch's int4 kernel (_weight_int4pack_mm_for_cpu), bfloat16 inputs: the default route", _int4
    ),
    WeightKernel("int8", "torch's int8 kernel (_weight_int8pack_mm), bfloat16 inputs: the head's first pass", _int8),
    WeightKernel(
        "dynamic int8",
        "quantized::linear_dynamic (x86 engine): int8 weights a scale a row, inputs rounded to 7-bit integers a call",
        _dynamic_int8,
        lambda: _dynamic_engine() is not None,
    ),
    WeightKernel("float16", "float16 weights and inputs, nn.functional.linear", _half(torch.float16)),
    WeightKernel("bfloat16", "bfloat16 weights and inputs, nn.functional.linear", _half(torch.bfloat16)),
    WeightKernel("float32", "float32 on oneDNN's packed weights: the float32 route", _float32),
)
BASELINE = "int4"


def step_calls(kernel: WeightKernel, calls, layers: int, seed: int = 0) -> tuple[list[Kernel], int]:
    """A step's calls on `kernel`: every layer's `calls` (in, out) on weights of its own → (kernels, bytes held)."""
    generator = torch.Generator().manual_seed(seed)
    prepared, held = [], 0
    for _ in range(layers):
        for inputs, outputs in calls:
            run, size = kernel.prepare(torch.randn(outputs, inputs, generator=generator) * 0.05)
            prepared.append((run, inputs))
            held += size
    return prepared, held


def measure(calls=SMOLLM2_CALLS, layers: int = SMOLLM2_LAYERS, rows: int = 1, rounds: int = 7) -> list[dict]:
    """Each available kernel's step (`step_calls`) timed in `rounds` interleaved rounds after one warm pass;
    → rows of name, what, the median and every round's ms, bytes held, and the ratio to the int4 step."""
    kernels = [k for k in KERNELS if k.available()]
    steps = {k.name: step_calls(k, calls, layers) for k in kernels}
    inputs = {width: torch.randn(rows, width) for width, _ in calls}
    times: dict[str, list[float]] = {k.name: [] for k in kernels}
    with torch.inference_mode():
        for round_ in range(rounds + 1):
            for kernel in kernels:
                prepared = steps[kernel.name][0]
                start = perf_counter()
                for run, width in prepared:
                    run(inputs[width])
                if round_:  # the first round warms (first calls allocate and pack)
                    times[kernel.name].append((perf_counter() - start) * 1000)
    base = statistics.median(times[BASELINE])
    return [
        {
            "kernel": kernel.name,
            "what": kernel.what,
            "ms_per_step": round(statistics.median(times[kernel.name]), 3),
            "ms_per_round": [round(t, 3) for t in times[kernel.name]],
            "weight_bytes": steps[kernel.name][1],
            "vs_int4": round(statistics.median(times[kernel.name]) / base, 3),
        }
        for kernel in kernels
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1, help="rows a call (1: a lone decode token)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = {
        "command": "python -m bench.weight_kernels " + " ".join(argv if argv is not None else sys.argv[1:]),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        **kernel_facts(),
        "load_average_before": load_average(),
        "rows": args.rows,
        "layers": SMOLLM2_LAYERS,  # the calls below, this many times a step
        "calls_per_layer": [list(call) for call in SMOLLM2_CALLS],
        "kernels": measure(SMOLLM2_CALLS, SMOLLM2_LAYERS, args.rows, args.rounds),
        "load_average_after": load_average(),
    }
    print(f"{result['cpu']} ({result['capability']}), {result['threads']} threads, {args.rows} row(s) a call:")
    for row in result["kernels"]:
        print(f"  {row['kernel']:>13}  {row['ms_per_step']:7.2f} ms a step  {row['vs_int4']:5.2f}x int4  {row['what']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
