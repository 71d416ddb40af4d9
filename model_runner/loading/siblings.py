"""Linear layers that read one input (q, k and v; gate and up) run as one wider call: the shared half of the
int4 route's Int4Siblings (loading/quantize.py) and the float32 route's PackedSiblings (loading/packed.py). The
first sibling called with an input computes all their outputs; the others take theirs."""

from __future__ import annotations

import threading

import torch

SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # transformers' names for them


class Siblings:
    """A group's one call for an input, handed out to its layers' forwards. A subclass sets `layers` and
    `widths` (each layer's out_features, in order) and defines `call(flat)`: [rows, in] → [rows, Σ out]."""

    layers: list
    widths: list[int]

    def __init__(self):
        self._held = _HeldOutputs()

    def call(self, flat: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def output(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """Sibling `index`'s output for x as [rows, its out_features], computed with its siblings' on the first
        call for this input tensor. The siblings are called back to back on the same tensor by the model's
        attention and MLP modules; a new tensor (the next layer, the next step) is a new call."""
        held = self._held
        if held.input is not x:
            held.input, held.outputs = None, ()  # never a stale output, even if the call below fails
            fused = self.call(x.reshape(-1, x.shape[-1]))
            held.input, held.outputs, held.untaken = x, fused.split(self.widths, dim=-1), len(self.widths)
        out = held.outputs[index]
        held.untaken -= 1
        if held.untaken == 0:  # every sibling has its output: hold no tensor until the next input
            held.input, held.outputs = None, ()
        return out

    def attach(self) -> None:
        """Mark each layer as this group's, by its index in the group."""
        for index, layer in enumerate(self.layers):
            layer.siblings, layer.sibling_index = self, index


class _HeldOutputs(threading.local):
    """A group's last input and outputs, per thread: the speculative experiment runs the same modules on a
    request's thread beside the engine's worker, and neither may take the other's output."""

    input: torch.Tensor | None = None
    outputs: tuple[torch.Tensor, ...] = ()
    untaken = 0


def alike(layers: list) -> bool:
    """Whether layers may share one call at all: one input width, and all with a bias or all without."""
    return len({layer.in_features for layer in layers}) == 1 and len({layer.bias is None for layer in layers}) == 1


def sibling_groups(model: torch.nn.Module):
    """Each module's sibling layers, [layer] in SIBLINGS' order, where the module has all of one group's names."""
    for module in model.modules():
        for names in SIBLINGS:
            layers = [getattr(module, name, None) for name in names]
            if all(layer is not None for layer in layers):
                yield layers
