"""float32 linear layers on oneDNN's packed weights, for the CPU's float32 matmuls: each weight is reordered
once, at load, into the blocked layout oneDNN's matmul reads (what vLLM's CPU backend and inductor's frozen
graphs do with the same library), then every call is torch's mkldnn linear on it; and the tied head's weight laid
input-major, where torch's float32 matmul at one row is faster; siblings that read one input (q, k, v; gate, up)
share one call on their weights packed side by side. Rounding differs from the unpacked call (another order of
the same sums), so the float32 route and the int4 route's prompts use it alike."""

from __future__ import annotations

import torch
from torch import nn

from model_runner.loading.siblings import Siblings, alike, sibling_groups

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
        self.packed: torch.Tensor | None = pack(weight)  # None once its PackedSiblings holds its rows
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.out_features, self.in_features = weight.shape
        self.siblings: PackedSiblings | None = None
        self.sibling_index = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.siblings is not None:
            return self.siblings.output(x, self.sibling_index).reshape(*x.shape[:-1], self.out_features)
        return packed_linear(x, self.packed, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, float32 on oneDNN's packed weights"


class PackedSiblings(Siblings):
    """PackedLinear layers that read one input (q, k and v; gate and up) as one oneDNN call on their weights
    packed side by side: the joined packed tensor replaces each layer's own (nothing held twice), and their
    biases are joined with it. One wider call costs less than several narrow ones at a decode step's row (q, k
    and v in 0.43x the three calls' time, gate and up in 0.60x, one row, two threads, on an AVX2-only AMD
    EPYC, in a timing made while choosing, not kept; docs/performance.md has the step's times). Each output is
    still its own sum over the same inputs, so the joined call gives the separate calls' bits: `joins_exactly`
    checks that on this CPU before joining."""

    def __init__(self, layers: list[PackedLinear], joined: tuple[torch.Tensor, torch.Tensor | None]):
        super().__init__()
        self.layers, self.widths = layers, [layer.out_features for layer in layers]
        self.packed, self.bias = joined  # joined_weights(layers, their weights)
        start = 0
        for layer in layers:
            layer.packed = None
            if self.bias is not None:  # each layer's bias a view of its own part: the bytes held once
                layer.bias = self.bias[start : start + layer.out_features]
            start += layer.out_features
        self.attach()

    def call(self, flat: torch.Tensor) -> torch.Tensor:
        return packed_linear(flat, self.packed, self.bias)

    def joined(self, x: torch.Tensor) -> torch.Tensor:
        """Every sibling's output for x [..., in] at once, [..., Σ out_features], side by side in sibling order."""
        return self.call(x)

    def joins(self, flat: torch.Tensor) -> bool:
        return True  # one call at any row count


PROBE_ROWS = (1, 4, 16, 64)  # a decode step's rows, a small batch's, a prompt's


def joined_weights(layers: list[PackedLinear], weights: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The layers' float32 weights packed side by side, and their biases joined (None when they have none)."""
    return pack(torch.cat(weights)), None if layers[0].bias is None else torch.cat([layer.bias for layer in layers])


def joins_exactly(layers: list[PackedLinear], joined: tuple[torch.Tensor, torch.Tensor | None]) -> bool:
    """Whether PackedSiblings of these layers on `joined` (joined_weights) would give each layer's own outputs
    bit for bit, on this CPU's oneDNN kernels, at PROBE_ROWS rows; the layers must be `alike`."""
    for rows in PROBE_ROWS:
        probe = torch.linspace(-1, 1, rows * layers[0].in_features).reshape(rows, -1)
        alone = torch.cat([layer(probe) for layer in layers], dim=-1)
        if not torch.equal(alone, packed_linear(probe, *joined)):
            return False
    return True


def join_siblings(model: nn.Module, weights: dict[int, torch.Tensor]) -> int:
    """Join each module's PackedLinear siblings into one PackedSiblings where `joins_exactly`; `weights` maps
    each PackedLinear's id to its float32 weight (the packed copy cannot be read back); returns how many groups."""
    groups = 0
    for layers in sibling_groups(model):
        if not all(type(layer) is PackedLinear and layer.siblings is None for layer in layers) or not alike(layers):
            continue
        joined = joined_weights(layers, [weights[id(layer)] for layer in layers])
        if joins_exactly(layers, joined):
            PackedSiblings(layers, joined)
            groups += 1
    return groups


def lay_in_major(weight: nn.Parameter) -> None:
    """Store a float32 [out, in] parameter as its transpose's contiguous bytes, viewed back as [out, in]: the same
    values and shape (an embedding still looks up its rows), read input-major by a matmul: torch's float32
    matmul read a head so about twice as fast at one row on an AMD EPYC, in a timing made while choosing it
    (not kept; docs/performance.md has the step's times before and after)."""
    with torch.no_grad():
        weight.data = weight.data.t().contiguous().t()


def pack_linears(model: nn.Module) -> int:
    """The float32 route on a CPU, in place: every float32 nn.Linear but the head becomes a PackedLinear, and
    siblings that read one input share one call (join_siblings); the head keeps its (usually the embedding's)
    weight, laid input-major; returns how many layers were packed."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weights = {}
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if child is head or type(child) is not nn.Linear or child.weight.dtype != torch.float32:
                continue
            layer = PackedLinear(child.weight, child.bias)
            weights[id(layer)] = child.weight.detach()
            setattr(parent, name, layer)
    join_siblings(model, weights)
    if isinstance(head, nn.Linear) and head.weight.dtype == torch.float32:
        lay_in_major(head.weight)
    return len(weights)
