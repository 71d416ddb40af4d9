"""Weight-only quantization for fast CPU decode, two routes: int4 (groups of 32 with a scale and a
zero each, the GGUF's Q4_1 layout, so the bundled model's weights come back exactly) and int8 (one
scale per output row); matmuls by torch's CPU kernels with bfloat16 inputs and fp32 accumulation.
Both share a head whose logits are float32: a fast approximate pass over the vocabulary, then the
leading candidates scored again exactly against the float32 embedding."""

from __future__ import annotations

import contextvars
from contextlib import contextmanager

import torch
from torch import nn

from model_runner.loading.packed import PackedLinear, pack, packed_linear
from model_runner.loading.siblings import Siblings, alike, sibling_groups

MM_DTYPE = torch.bfloat16  # the activation dtype the int4/int8 kernels are fast with (fp32, fp16 take slow paths)
GROUP = 32  # int4: inputs per scale and zero (the GGUF's Q4_1 block)
K_MULTIPLE = 16  # the CPU kernel reads inputs 16 at a time: other widths give wrong sums (or crash), so they stay float
# A call with at least this many rows (a prompt's prefill) runs on the float32 weights where a route keeps
# them: torch's int4/int8 kernels lose to float32's GEMM on many rows (2.5x slower at 64 under AVX2,
# docs/history/2026-12-02-performance.md, "Candidates, side by side"), while a decode step's few rows are bound by the bytes read, where 4 bits win.
FLOAT_ROWS = 16
RESCORED = 32  # head candidates scored again in float32: far more than the approximate head's error can reorder


# A step that mixes chunks of chunked prefills (often the rest of a prompt after its cached prefix) with decodes
# runs on the kernels' weights while it has at most this many rows. Over this model's layers the int4 kernel
# still beat float32's GEMM at 45 rows under AVX-512 and lost at 80 (two threads,
# docs/history/2026-12-02-performance.md, "A class's steps"), so 40 keeps a margin; under AVX2 the two tied at 15 rows and float32 won from 23, so there
# a mixed step keeps the rule of any other call (float32 from FLOAT_ROWS rows).
MIXED_KERNEL_ROWS = (("AVX512", 40),)  # (torch's CPU capability prefix, rows); any other: FLOAT_ROWS - 1


def mixed_kernel_rows() -> int:
    """The most rows a step mixing prompt rows with decode tokens runs on the kernels, on this CPU's kernels."""
    capability = torch.backends.cpu.get_cpu_capability().upper()
    return next((rows for prefix, rows in MIXED_KERNEL_ROWS if capability.startswith(prefix)), FLOAT_ROWS - 1)


_KERNEL_STEP = contextvars.ContextVar("kvscope_kernel_step", default=False)


@contextmanager
def kernel_step():
    """Inside: a step whose rows all run on the kernels' weights and the head's int8 pass whatever their count:
    a step of decode tokens only (one new token a request), however many requests share it, or a small step
    mixing chunks of chunked prefills with decodes (mixed_kernel_rows(), local/step/forward.py on_kernels). 16 decode rows on torch's int4 kernel take
    about half float32's time on this AVX-512 CPU (measured, docs/history/2026-12-02-performance.md, "A decode
    batch is not a prompt"), and a batch of 16 on the
    float32 copies ran 172 ms a step against 59 ms for 8 (the serving chapter's recording before this)."""
    token = _KERNEL_STEP.set(True)
    try:
        yield
    finally:
        _KERNEL_STEP.reset(token)


def _prompt_rows(flat: torch.Tensor) -> bool:
    """Whether a call runs on the float32 weights: FLOAT_ROWS rows or more, outside a kernel step."""
    return flat.shape[0] >= FLOAT_ROWS and not _KERNEL_STEP.get()


def _rows(x: torch.Tensor, in_features: int) -> torch.Tensor:
    return x.reshape(-1, in_features)


class Int8Linear(nn.Module):
    """y = x W^T (+ b) with W stored as int8 rows times a per-row scale (symmetric, absmax / 127)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        with torch.no_grad():
            w = weight.detach()
            absmax = torch.linalg.vector_norm(w.float(), ord=float("inf"), dim=1).clamp(min=1e-12)  # [out]
            scale = (absmax / 127.0).to(MM_DTYPE)  # rounded first, so the int8 values fit the scale the kernel uses
            q = torch.div(w, scale.float()[:, None]).round_().clamp_(-127, 127).to(torch.int8)  # one temporary
        self.register_buffer("weight", q)
        self.register_buffer("scales", scale)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.in_features, self.out_features = w.shape[1], w.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = _rows(x, self.in_features).to(MM_DTYPE).contiguous()  # the kernel wants [rows, in]
        y = torch.ops.aten._weight_int8pack_mm(flat, self.weight, self.scales).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights, per-row scales"


class Int4Linear(nn.Module):
    """y = x W^T (+ b) with W in groups of 32 inputs, each w = d * q + m with q in 0..15 (asymmetric
    4-bit: the GGUF's Q4_1 layout, so the bundled model's Q4_1 weights come back exactly: a group's
    min has q = 0 and its max q = 15 by construction); torch's int4 CPU kernel, scales in bfloat16.
    With `keep_float`, calls of FLOAT_ROWS rows or more (prefill) run on the float weights instead, packed for
    oneDNN as the float32 route packs them (model_runner/loading/packed.py), so a prompt is float32's bits."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, keep_float: bool = False):
        super().__init__()
        out_features, in_features = weight.shape
        with torch.no_grad():
            groups = weight.detach().float().reshape(out_features, in_features // GROUP, GROUP)
            low = groups.amin(dim=-1)  # m
            step = (groups.amax(dim=-1) - low) / 15  # d
            q = torch.div(groups - low[..., None], step.clamp(min=1e-30)[..., None]).round_().clamp_(0, 15)
            q = q.reshape(out_features, in_features).to(torch.int32)
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
            # The kernel computes (q - 8) * scale + zero: scale = d, zero = m + 8 d; [in/32, out, 2].
            scales_zeros = torch.stack([step, low + 8 * step], dim=-1).transpose(0, 1).contiguous()
        self.register_buffer("weight", packed)
        self.register_buffer("scales_zeros", scales_zeros.to(MM_DTYPE))
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        # The float weights as the float32 route packs them, in place of the model's own (held once): prefill
        # then computes exactly what float32 computes. An opaque tensor: an attribute, not a buffer.
        self.float_weight = pack(weight) if keep_float else None
        self.in_features, self.out_features = in_features, out_features
        self.siblings: Int4Siblings | None = None  # set when it shares one int4 call with its siblings
        self.sibling_index = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = _rows(x, self.in_features)
        if on_float_weights(self, flat):
            return packed_linear(x, self.float_weight, self.bias)
        if self.siblings is not None:
            y = self.siblings.output(x, self.sibling_index)
        else:
            y = int4_mm(flat, self.weight, self.scales_zeros, x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        prefill = f", float weights from {FLOAT_ROWS} rows" if self.float_weight is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 groups of {GROUP}{prefill}"


def on_float_weights(layer: Int4Linear, flat: torch.Tensor) -> bool:
    """Whether an Int4Linear runs these rows on its float weights (kept for prefill): a prompt's many rows."""
    return layer.float_weight is not None and _prompt_rows(flat)


def int4_mm(flat: torch.Tensor, weight: torch.Tensor, scales_zeros: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[rows, in] → [rows, out] in `dtype`, through torch's int4 CPU kernel (bfloat16 in, contiguous scales)."""
    packed = torch.ops.aten._weight_int4pack_mm_for_cpu
    return packed(flat.to(MM_DTYPE).contiguous(), weight, GROUP, scales_zeros).to(dtype)


def decode_kernel(layer) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(packed weights, scales) of the one bias-free int4 call that computes `layer`'s output on the kernel's
    weights, for `int4_mm`: an Int4Siblings group's joined call, or a lone Int4Linear's; None for any other
    layer (float, int8, biased), which its own forward runs."""
    if isinstance(layer, Int4Siblings):
        return None if layer.biased else (layer.weight, layer.scales_zeros)
    if isinstance(layer, Int4Linear) and layer.siblings is None and layer.bias is None:
        return layer.weight, layer.scales_zeros
    return None


class Int4Siblings(Siblings):
    """Int4Linear layers that read the same input (q, k and v; gate and up) run as one int4 call: their packed
    weights and scales become one tensor each and each layer's buffers views of its own rows (nothing held
    twice); the first sibling called with an input computes all their outputs, the others take theirs. Bit
    for bit the separate calls (each output is its own sum); fewer, wider calls cost less a decode step
    (one call for q, k, v took 0.68x the three calls' time at one row under AVX2,
    docs/history/2026-12-02-performance.md, "Less work per token outside the matmuls")."""

    def __init__(self, layers: list[Int4Linear]):
        super().__init__()
        self.weight = torch.cat([layer.weight for layer in layers])  # packed rows: one per output
        self.scales_zeros = torch.cat([layer.scales_zeros for layer in layers], dim=1)  # [in/32, out, 2]
        self.widths = [layer.out_features for layer in layers]
        self.layers = layers
        self.biased = any(layer.bias is not None for layer in layers)
        start = 0
        for layer in layers:
            end = start + layer.out_features
            layer.weight = self.weight[start:end]
            # A strided view, so the bytes are counted once: the kernel reads only the whole, contiguous tensor.
            layer.scales_zeros = self.scales_zeros[:, start:end]
            start = end
        self.attach()

    def call(self, flat: torch.Tensor) -> torch.Tensor:
        return int4_mm(flat, self.weight, self.scales_zeros, flat.dtype)

    def joined(self, x: torch.Tensor) -> torch.Tensor | None:
        """Every sibling's output for x at once, [rows, Σ out_features], side by side in sibling order: the one
        int4 call their forwards share, bit for bit (the native step, local/model/native.py, takes it whole). None
        where the forwards would not make that call: a prompt's rows on the float weights, or biases to add."""
        flat = _rows(x, x.shape[-1])
        return self.call(flat) if self.joins(flat) else None

    def joins(self, flat: torch.Tensor) -> bool:
        """Whether `joined` makes its one call for these rows [rows, in] (not biased, not a prompt's float rows)."""
        return not self.biased and not on_float_weights(self.layers[0], flat)


PACK_BLOCK = 64  # output rows a packed block holds at most (64 on AVX-512, 32 on AVX2)


def _joinable(layers: list) -> bool:
    """All Int4Linear, ungrouped, on one input width, all with or all without a bias, and their packed weights
    joined give each layer's sums exactly. The kernel packs output rows in blocks (64 under AVX-512, 32
    under AVX2: measured), so joining is exact only at whole blocks; the probe makes sure on this CPU."""
    if not all(isinstance(layer, Int4Linear) and layer.siblings is None for layer in layers) or not alike(layers):
        return False
    if any(layer.out_features % PACK_BLOCK for layer in layers):
        return False
    probe = torch.linspace(-1, 1, layers[0].in_features)[None]
    alone = torch.cat([int4_mm(probe, layer.weight, layer.scales_zeros, torch.float32) for layer in layers], -1)
    weight = torch.cat([layer.weight for layer in layers])
    joined = int4_mm(probe, weight, torch.cat([layer.scales_zeros for layer in layers], dim=1), torch.float32)
    return torch.equal(alone, joined)


def group_siblings(model: nn.Module) -> int:
    """Join each module's siblings (loading/siblings.py) into one Int4Siblings where they are _joinable; returns how many groups."""
    groups = 0
    for layers in sibling_groups(model):
        if _joinable(layers):
            Int4Siblings(layers)
            groups += 1
    return groups


class RescoredHead(nn.Module):
    """The LM head with float32 logits at the cost of an int8 one: an int8 pass (per-row scales, bfloat16
    input) gives approximate logits for the whole vocabulary, then the RESCORED highest are computed
    again exactly from the float32 weights (the embedding's own tensor when tied: no extra bytes). A
    greedy choice, the top-5 the page shows and their near-ties are then float32's: a bfloat16 or float16
    logit (steps of 0.06 or 0.008 near 14) ties close candidates, and which one wins then follows the
    batch's company. The int8 pass's error (a few hundredths here) is far below the gap to the 32nd."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.approximate = Int8Linear(weight)
        self.approximate.tied_copy = True  # a copy of float_weight: the same weights, counted once
        self.register_buffer("float_weight", weight.detach())
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = _rows(x, self.in_features).float()
        if _prompt_rows(flat):  # a prompt's many rows: the float32 GEMM is the fast path
            return nn.functional.linear(flat, self.float_weight.float(), self.bias).reshape(*x.shape[:-1], -1)
        logits = self.approximate(flat).float()
        if self.bias is not None:
            logits += self.bias.float()
        top = logits.topk(min(RESCORED, self.out_features), dim=-1).indices  # [rows, k]
        rows = self.float_weight.index_select(0, top.reshape(-1)).float().reshape(*top.shape, self.in_features)
        exact = torch.einsum("rkd,rd->rk", rows, flat)
        if self.bias is not None:
            exact = exact + self.bias.float()[top]
        return logits.scatter_(-1, top, exact).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 pass, top {RESCORED} float32"


def int4_fits(layer: nn.Linear) -> bool:
    """The int4 kernel's shapes: whole groups of 32 inputs, outputs in sixteens."""
    return layer.in_features % GROUP == 0 and layer.out_features % 16 == 0


def _replace_linears(model: nn.Module, make) -> int:
    """Swap each nn.Linear for make(child, is_head) where that returns a layer; the head (untied from the
    float embedding, which stays) becomes a RescoredHead; returns how many non-head layers were swapped."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    embedding = model.get_input_embeddings().weight if hasattr(model, "get_input_embeddings") else None
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Linear) or child.in_features % K_MULTIPLE:
                continue
            if child is head:
                layer = RescoredHead(child.weight, child.bias)
            else:
                layer = make(child)
                if layer is None:
                    continue
                count += 1
            layer.tied_copy = child.weight is embedding  # a second copy of the embedding's weights, not more weights
            setattr(parent, name, layer)
    if getattr(model.config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False  # the head holds its own int8 pass now
    return count


def quantize_int4(model: nn.Module, keep_float: bool = False, siblings: bool = True) -> int:
    """The int4 route, in place: every linear layer of the kernel's shapes becomes an Int4Linear (with its
    float weights kept for prefill when `keep_float`), the head a RescoredHead, and with `siblings` the
    projections that read one input share one int4 call (group_siblings); returns how many went int4."""
    count = _replace_linears(
        model, lambda child: Int4Linear(child.weight, child.bias, keep_float) if int4_fits(child) else None
    )
    if siblings:
        group_siblings(model)
    return count


def quantize_int8(model: nn.Module) -> int:
    """The int8 route, in place: every linear layer whose input width the kernel takes becomes an
    Int8Linear, the head a RescoredHead; returns how many layers went int8 (the head not counted)."""
    return _replace_linears(model, lambda child: Int8Linear(child.weight, child.bias))


QUANTIZED = (Int8Linear, Int4Linear, RescoredHead)


def weight_count_and_bytes(model: nn.Module) -> tuple[int, int]:
    """(weights, bytes they occupy): float parameters (tied ones once), the quantized layers' tensors (packed
    weights, scales, biases, float weights kept for prefill or rescoring) and oneDNN's packed float32 weights
    (model_runner/loading/packed.py: opaque tensors, keyed by identity), each tensor once."""
    tensors = {p.data_ptr(): p for p in model.parameters()}
    count = sum(t.numel() for t in tensors.values())
    for layer in (m for m in model.modules() if isinstance(m, (*QUANTIZED, PackedLinear))):
        if not getattr(layer, "tied_copy", False):
            bias = layer.bias.numel() if layer.bias is not None else 0
            count += layer.in_features * layer.out_features + bias  # int4 packs two weights a byte
        for t in layer.buffers(recurse=False):
            if t is not None:
                tensors[t.data_ptr()] = t
        packed = layer.packed if isinstance(layer, PackedLinear) else getattr(layer, "float_weight", None)
        if isinstance(layer, PackedLinear) and packed is None:
            packed = layer.siblings.packed  # the group's joined weights (packed.PackedSiblings), once by identity
        if packed is not None:  # oneDNN's opaque tensor has no storage to key by; without oneDNN, the weight
            tensors[("packed", id(packed)) if packed.is_mkldnn else packed.data_ptr()] = packed
    return count, sum(t.numel() * t.element_size() for t in tensors.values())
