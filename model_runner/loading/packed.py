"""float32 linear layers on oneDNN's packed weights, for the CPU's float32 matmuls: each weight is reordered
once, at load, into the blocked layout oneDNN's matmul reads (what vLLM's CPU backend and inductor's frozen
graphs do with the same library), then every call is torch's mkldnn linear on it; and the tied head's weight laid
input-major, where torch's float32 matmul at one row is faster. Rounding differs from the unpacked call (another
order of the same sums), so the float32 route and the int4 route's prompts use it alike."""

from __future__ import annotations

import torch
from torch import nn

KERNEL_NOTE = "float32 matmuls on oneDNN's packed weights (reordered once at load)"


def available(device: torch.device) -> bool:
    """Whether torch here has oneDNN's CPU matmul, and the weights live on the CPU."""
    return device.type == "cpu" and torch.backends.mkldnn.is_available()


def pack(weight: torch.Tensor) -> torch.Tensor:
    """A float32 [out, in] weight reordered for oneDNN's matmul: an opaque tensor (no storage to view), only
    `packed_linear` reads it. Packed for one row (a decode step's); it serves any row count. Where torch has
    no oneDNN, the weight itself."""
    if not available(weight.device):
        return weight.detach()
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach().float().contiguous(), 1)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., in] float32 → x W^T (+ b) [..., out], W as `pack` left it."""
    if not packed.is_mkldnn:
        return nn.functional.linear(x, packed, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


class PackedLinear(nn.Module):
    """An nn.Linear of float32 weights on oneDNN's packed copy of them; the packed tensor replaces the weight
    (nothing held twice) and is a plain attribute, not a buffer, since module-wide casts and moves cannot act
    on it (model_runner/loading/quantize.py weight_count_and_bytes counts it)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.packed = pack(weight)
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.out_features, self.in_features = weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_linear(x, self.packed, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, float32 on oneDNN's packed weights"


def lay_in_major(weight: nn.Parameter) -> None:
    """Store a float32 [out, in] parameter as its transpose's contiguous bytes, viewed back as [out, in]: the same
    values and shape (an embedding still looks up its rows), read input-major by a matmul: torch's float32
    matmul read a head so about twice as fast at one row on an AMD EPYC, in a timing made while choosing it
    (not kept; docs/performance.md has the step's times before and after)."""
    with torch.no_grad():
        weight.data = weight.data.t().contiguous().t()


def pack_linears(model: nn.Module) -> int:
    """The float32 route on a CPU, in place: every float32 nn.Linear but the head becomes a PackedLinear; the
    head keeps its (usually the embedding's) weight, laid input-major; returns how many layers were packed."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if child is head or type(child) is not nn.Linear or child.weight.dtype != torch.float32:
                continue
            setattr(parent, name, PackedLinear(child.weight, child.bias))
            count += 1
    if isinstance(head, nn.Linear) and head.weight.dtype == torch.float32:
        lay_in_major(head.weight)
    return count
