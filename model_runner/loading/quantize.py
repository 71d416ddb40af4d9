"""Weight-only quantization for fast CPU decode, two routes: int4 (groups of 32 with a scale and a
zero each, the GGUF's Q4_1 layout, so the bundled model's weights come back exactly; LM head in
float16) and int8 (one scale per output row, LM head included); matmuls by torch's CPU kernels
with bfloat16 inputs and fp32 accumulation; the embedding, norms and attention keep their dtype."""

from __future__ import annotations

import torch
from torch import nn

MM_DTYPE = torch.bfloat16  # the activation dtype the int4/int8 kernels are fast with (fp32, fp16 take slow paths)
HEAD_DTYPE = torch.float16  # the int4 route's LM head (HalfLinear)
GROUP = 32  # int4: inputs per scale and zero (the GGUF's Q4_1 block)
K_MULTIPLE = 16  # the CPU kernel reads inputs 16 at a time: other widths give wrong sums (or crash), so they stay float


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
        flat = x.reshape(-1, self.in_features).to(MM_DTYPE).contiguous()  # the kernel wants [rows, in]
        y = torch.ops.aten._weight_int8pack_mm(flat, self.weight, self.scales).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights, per-row scales"


class Int4Linear(nn.Module):
    """y = x W^T (+ b) with W in groups of 32 inputs, each w = d * q + m with q in 0..15 (asymmetric
    4-bit: the GGUF's Q4_1 layout, so the bundled model's Q4_1 weights come back exactly: a group's
    min has q = 0 and its max q = 15 by construction); torch's int4 CPU kernel, scales in bfloat16."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
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
        self.in_features, self.out_features = in_features, out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(MM_DTYPE).contiguous()
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.weight, GROUP, self.scales_zeros).to(x.dtype)
        if self.bias is not None:
            y = y + self.bias.to(x.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int4 groups of {GROUP}"


class HalfLinear(nn.Module):
    """A linear layer kept in float16 (the int4 route's LM head): half the bytes of float32. float16,
    not bfloat16: its 10-bit mantissa keeps logits apart that bfloat16's 7 bits would round into
    ties (at logit 14, bfloat16 steps by 0.0625, float16 by 0.008), and torch's CPU float16 matmul
    was 2.4x faster than bfloat16 for this head here (1.7 vs 4.2 ms, 49152 x 576)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.register_buffer("weight", weight.detach().to(HEAD_DTYPE).contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().to(HEAD_DTYPE).clone())
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x.to(HEAD_DTYPE), self.weight, self.bias).to(x.dtype)


def int4_fits(layer: nn.Linear) -> bool:
    """The int4 kernel's shapes: whole groups of 32 inputs, outputs in sixteens."""
    return layer.in_features % GROUP == 0 and layer.out_features % 16 == 0


def quantize_int4(model: nn.Module) -> int:
    """The int4 route, in place: every linear layer of the kernel's shapes becomes an Int4Linear, the LM
    head a float16 copy (untied from the float embedding); returns how many layers went int4."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    embedding = model.get_input_embeddings().weight if hasattr(model, "get_input_embeddings") else None
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if child is head and isinstance(child, nn.Linear):
                layer = HalfLinear(child.weight, child.bias)
            elif isinstance(child, nn.Linear) and int4_fits(child):
                layer, count = Int4Linear(child.weight, child.bias), count + 1
            else:
                continue
            layer.tied_copy = child.weight is embedding
            setattr(parent, name, layer)
    if getattr(model.config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False
    return count


def quantize_int8(model: nn.Module) -> int:
    """Replace every nn.Linear under `model` whose input width the kernel takes (the LM head included,
    untied from the embedding, which stays in float) with an Int8Linear, in place; returns how many."""
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear) and child.in_features % K_MULTIPLE == 0
    ]
    embedding = model.get_input_embeddings().weight if hasattr(model, "get_input_embeddings") else None
    for parent, name, child in targets:
        layer = Int8Linear(child.weight, child.bias)
        layer.tied_copy = child.weight is embedding  # a second copy of the embedding's weights, not more weights
        setattr(parent, name, layer)
    if getattr(model.config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False  # the head is int8 now; the embedding keeps its floats
    return len(targets)


QUANTIZED = (Int8Linear, Int4Linear, HalfLinear)


def is_quantized(model: nn.Module) -> bool:
    return any(isinstance(m, QUANTIZED) for m in model.modules())


def weight_count_and_bytes(model: nn.Module) -> tuple[int, int]:
    """(weights, bytes they occupy): float parameters (tied ones once) and the int8 layers' weights,
    with their scales and biases counted in the bytes."""
    tensors = {p.data_ptr(): p for p in model.parameters()}
    count = sum(t.numel() for t in tensors.values())
    for layer in (m for m in model.modules() if isinstance(m, QUANTIZED)):
        if not getattr(layer, "tied_copy", False):
            bias = layer.bias.numel() if layer.bias is not None else 0
            count += layer.in_features * layer.out_features + bias  # int4 packs two weights a byte
        for t in (layer.weight, getattr(layer, "scales", None), getattr(layer, "scales_zeros", None), layer.bias):
            if t is not None:
                tensors[t.data_ptr()] = t
    return count, sum(t.numel() * t.element_size() for t in tensors.values())
