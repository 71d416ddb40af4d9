"""The --dtype routes: which dtype the model computes in and how its linear layers are stored, what
`auto` picks from the device and the CPU's vector capability and why, and how a loaded model is
brought to its route (model_runner/loading/quantize.py holds the quantized layers)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch

from model_runner.loading.packed import KERNEL_NOTE, available
from model_runner.loading.quantize import FLOAT_ROWS, mixed_kernel_rows
from model_runner.protocol.errors import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
QUANTIZED_ROUTES = ("int4", "int8")  # weight-only quantized linear layers, float32 elsewhere (CPU only)
DTYPE_CHOICES = ("auto", *DTYPES, *QUANTIZED_ROUTES)
DTYPE_HELP = (
    "auto (the bundled model on a CPU with AVX2 or AVX-512: int4, else float32; GPU: bf16/fp16), "
    "float32, bfloat16, float16, "
    "int4 (CPU: 4-bit linear layers in groups of 32, exact for the bundled Q4_1 GGUF) or int8 "
    "(CPU: int8 linear layers, one scale per row); both keep float32 activations, KV cache and logits"
)
Progress = Callable[[str], None]


@dataclass(frozen=True)
class DtypeRoute:
    """How the weights are stored and in which dtype the model computes."""

    name: str  # the --dtype value that gives this route
    compute: torch.dtype  # activations, norms, attention and the KV cache
    quant: str  # "", "int4" or "int8": how the linear layers are stored (model_runner/loading/quantize.py)
    reason: str
    float_prefill: bool = False  # int4: prompts of FLOAT_ROWS tokens or more run on the float32 weights
    packed: bool = False  # float32 linear layers on oneDNN's packed weights (model_runner/loading/packed.py)


def _float(name: str, device: torch.device, reason: str) -> DtypeRoute:
    """A float route; on a CPU with oneDNN, float32's linear layers on its packed weights (faster at every row
    count measured: docs/performance.md)."""
    packed = DTYPES[name] == torch.float32 and available(device)
    return DtypeRoute(name, DTYPES[name], "", reason + (f"; {KERNEL_NOTE}" if packed else ""), packed=packed)


def fast_route_for(capability: str) -> str | None:
    """The quantized route whose torch kernel is fast on a CPU of this vector capability (as
    torch.backends.cpu.get_cpu_capability() names it): int4 on AVX-512 and on AVX2 (torch 2.13's
    int4 kernel has an AVX2 path as fast as int8's, docs/history/2026-12-02-performance.md, "Candidates, side
    by side"); None elsewhere."""
    name = capability.upper()
    return "int4" if name.startswith(("AVX512", "AVX2")) else None


def float_prefill_for(capability: str) -> bool:
    """Whether int4 runs a prompt's prefill on the float32 weights (kept at load): on AVX2 and AVX-512 alike,
    since a prompt run in float32 leaves float32's own KV cache and first token, so the greedy answers stay
    the model's (identical to float32 on 20 and 21 of 24 prompts with it, 17 and 19 without, measured), and
    under AVX2 torch's int4 kernel takes 2.5x float32's time on 64 rows (docs/history/2026-12-02-performance.md,
    "Candidates, side by side"). A small step
    mixing a prompt's chunk with decodes is the exception (quantize.mixed_kernel_rows: int4 is faster there)."""
    return capability.upper().startswith(("AVX512", "AVX2"))


def _quantized(name: str, reason: str) -> DtypeRoute:
    capability = torch.backends.cpu.get_cpu_capability()
    float_prefill = name == "int4" and float_prefill_for(capability)
    if float_prefill:
        reason += "; prompts on the float32 weights (float32's own prefill: faster, and the answers stay the model's)"
    packed = float_prefill and available(torch.device("cpu"))
    return DtypeRoute(name, torch.float32, name, reason, float_prefill, packed)


def resolve_route(dtype: str, device: torch.device, bundled: bool = True) -> DtypeRoute:
    """The route for a --dtype value; `auto` quantizes on a CPU only the bundled model (`bundled`), whose
    Q4_1 weights int4 recovers exactly: another model's float weights would lose precision."""
    if dtype not in DTYPE_CHOICES:
        raise UserError(
            f"--dtype must be auto, float32, bfloat16 or float16 (or int4 or int8 on a CPU), got {dtype!r}",
            code="bad_dtype",
            field="dtype",
        )
    if dtype in QUANTIZED_ROUTES:
        if device.type != "cpu":
            raise UserError(
                f"--dtype {dtype} is a CPU route (torch's {dtype} weight kernels for CPUs); on {device.type} use "
                "--dtype auto, bfloat16 or float16",
                code="bad_dtype",
                field="dtype",
            )
        return _quantized(dtype, f"--dtype {dtype}")
    if dtype != "auto":
        return _float(dtype, device, f"--dtype {dtype}")
    if device.type == "cuda":
        name = "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
        return DtypeRoute(name, DTYPES[name], "", f"auto on a CUDA GPU: {name}")
    if device.type == "mps":
        return DtypeRoute("float16", torch.float16, "", "auto on Apple MPS: float16")
    if not bundled:
        return _float("float32", device, "auto on a CPU for a --model other than the bundled one: float32")
    capability = torch.backends.cpu.get_cpu_capability()
    fast = fast_route_for(capability)
    if fast:
        return _quantized(fast, f"auto on a CPU with {capability}: {fast} weights (the GGUF's own 4-bit groups)")
    return _float("float32", device, f"auto on a CPU without AVX2 ({capability}): float32")


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """The dtype the model computes in (and its KV cache holds) for a --dtype value."""
    return resolve_route(dtype, device).compute


HEAD_NOTE = (
    "the LM head gives float32 logits: an int8 pass over the vocabulary, its 32 highest scored again from the "
    "float32 embedding"
)
QUANT_NOTES = {
    "int4": "int4 weight-only: the linear layers hold 4-bit weights in groups of 32 inputs, each with a scale and "
    "a minimum (the GGUF's Q4_1 layout: the bundled model's Q4_1 weights are recovered exactly, scales rounded "
    "to bfloat16); decode matmuls take bfloat16 inputs and accumulate in fp32; {prefill}; " + HEAD_NOTE + "; "
    "the embedding, norms, attention and KV cache stay {dtype}",
    "int8": "int8 weight-only: every linear layer holds int8 weights with one scale per output row (symmetric, "
    "absmax/127, made at load from the model's float weights); matmuls take bfloat16 inputs and accumulate in "
    "fp32; " + HEAD_NOTE + "; the embedding, norms, attention and KV cache stay {dtype}",
}


# The int4 route's promise for the bundled model, as its quality guard checks it on 24 fixed prompts: a greedy
# answer leaves float32's only where float32's top two logits are within NEAR_TIE_LOGITS (the route rounds its
# decode matmuls' inputs to bfloat16, so it cannot tell such a pair apart on every CPU), and at least
# AGREEMENT_FLOOR of the 24 answers are float32's over all 32 tokens (19-21 measured on AMD and Intel CPUs).
NEAR_TIE_LOGITS = 0.5
AGREEMENT_FLOOR = 16
AGREEMENT_NOTE = (
    "; greedy answers of the bundled model (24 fixed prompts, 32 tokens) leave float32's only at a near-tie, a "
    f"token where float32's own top two are within {NEAR_TIE_LOGITS:g} logits, and at least {AGREEMENT_FLOOR} of "
    "24 are identical"
)


def quantization_note(route: DtypeRoute, dtype_name: str) -> str:
    """What /api/model says about how the weights run ("none" for a float route), and for int4 what its greedy
    answers promise against float32's."""
    if not route.quant:
        return "none"
    prefill = (
        f"a prompt's step of {FLOAT_ROWS} tokens or more runs on the float32 weights, kept for prefill"
        + (" (packed for oneDNN, as the float32 route packs them)" if route.packed else "")
        + ": float32's own arithmetic and KV cache for the prompt (decode steps, however many requests share "
        f"them, stay on the int4 kernel, and so does a step mixing chunked prefills' chunks with decodes of up to "
        f"{mixed_kernel_rows()} rows on this CPU)"
        if route.float_prefill
        else "prompts run on the int4 weights too"
    )
    promise = AGREEMENT_NOTE if route.quant == "int4" else ""
    return QUANT_NOTES[route.quant].format(dtype=dtype_name, prefill=prefill) + promise


def fake_route(dtype: str) -> DtypeRoute:
    """The test model runs float32 under `auto` (tests' numbers stay put); a named --dtype runs that route."""
    if dtype == "auto":
        return DtypeRoute("float32", torch.float32, "", "the test model runs float32 under auto")
    return resolve_route(dtype, torch.device("cpu"))


def apply_route(model, route: DtypeRoute, progress: Progress = lambda msg: None) -> None:
    """Bring a loaded model to its route: the compute dtype, then int4 or int8 linear layers if the route says so
    (quantized at load in about a second for the 135M model, so no second cache format is kept)."""
    if next(model.parameters()).dtype != route.compute:
        model.to(route.compute)
    if route.quant:
        from model_runner.loading.quantize import quantize_int4, quantize_int8

        started = time.perf_counter()
        count = quantize_int4(model, route.float_prefill) if route.quant == "int4" else quantize_int8(model)
        progress(
            f"{route.quant}: {count} linear layers quantized in {time.perf_counter() - started:.1f} s ({route.reason})"
        )
    elif route.packed:
        from model_runner.loading.packed import pack_linears

        started = time.perf_counter()
        count = pack_linears(model)
        progress(f"float32: {count} linear layers packed for oneDNN in {time.perf_counter() - started:.1f} s")
