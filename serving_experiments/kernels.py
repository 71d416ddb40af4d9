"""The model's own kernels timed as a step runs them: every decoder layer's projections at a row count (int4
siblings in their one joined call, as the native step makes it) and the head, best of interleaved rounds on the
process's threads; serving_experiments/roofline.py sets each step beside these floors."""

from __future__ import annotations

import time
from contextlib import nullcontext

REPEATS = 9  # each kernel's best of this many calls, interleaved, so a busy moment spoils one call of each


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def best_of(device, repeats: int, work) -> float:
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        work()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def _decoder_layers(model):
    """The model's repeated decoder layers: the first module list as long as its config's layer count."""
    from torch import nn

    count = model.config.num_hidden_layers
    return next(m for m in model.modules() if isinstance(m, nn.ModuleList) and len(m) == count)


def _head(model):
    """The LM head as it runs (a RescoredHead on the quantized routes, else the model's own linear layer)."""
    return next(m for name, m in model.named_modules() if name.split(".")[-1] == "lm_head")


def _projections(layer) -> list:
    """One decoder layer's linear projections in the order the model calls them (q, k, v, o, gate, up, down)."""
    from torch import nn

    from model_runner.loading.packed import PackedLinear
    from model_runner.loading.quantize import QUANTIZED

    return [m for m in layer.modules() if isinstance(m, (nn.Linear, PackedLinear, *QUANTIZED))]


def _step_calls(projections: list, x) -> list[tuple]:
    """A layer's projections as the step calls them: [(function, input width)], one joined call a sibling group
    that joins at these rows (loading/quantize.py Int4Siblings.joined: not on the float weights a prompt takes;
    loading/packed.py PackedSiblings: at any rows), else each module's own forward."""
    calls, seen = [], set()
    for module in projections:
        siblings = getattr(module, "siblings", None)
        if siblings is not None and siblings.joins(x.reshape(-1, x.shape[-1])):
            if id(siblings) not in seen:
                seen.add(id(siblings))
                calls.append((siblings.joined, module.in_features))
            continue
        calls.append((module.forward, module.in_features))
    return calls


class Kernels:
    """Times the model's own kernels at a row count as a step runs them: every decoder layer's projections in
    turn, each layer's as the model calls them (int4 siblings in their one joined call, Int4Siblings), on
    inputs made before the clock starts, and the head at its logits rows; best of REPEATS interleaved rounds.
    Torch's intra-op threads are the process's, so the step's: the engine's worker and this thread share them."""

    def __init__(self, loaded):
        import torch

        self.model = loaded.model
        self.device = torch.device(loaded.facts.device)
        self.dtype = next(self.model.parameters()).dtype
        layers = _decoder_layers(self.model)
        self.layers = len(layers)
        self.projections = _projections(layers[0])
        self.every_layer = [_projections(layer) for layer in layers]
        self.head = _head(self.model)

    def _x(self, rows: int, width: int):
        import torch

        return torch.randn(1, rows, width, device=self.device, dtype=self.dtype)

    def _layer_call(self, rows: int, layers: list | None = None):
        # one tensor a width; each layer's calls as the native step makes them (local/model/native.py project):
        # int4 siblings (q, k, v; gate, up) in their one joined call, every other projection by its own forward,
        # with no module call around them: the floor is the kernels', not the framework's per-module dispatch
        inputs = {m.in_features: self._x(rows, m.in_features) for m in self.projections}
        calls = [
            (call, inputs[width])
            for projections in layers or self.every_layer
            for call, width in _step_calls(projections, inputs[self.projections[0].in_features])
        ]

        def run():
            for call, x in calls:
                call(x)

        return run

    def _work(self, call: tuple[str, int, bool]):
        part, rows, _ = call
        if part == "gemm":  # the GEMM's rate only: one layer stands for all (its time times the layers)
            return self._layer_call(rows, self.every_layer[:1])
        return (self._layer_call if part == "layers" else self._head_call)(rows)

    def _head_call(self, rows: int):
        x = self._x(rows, self.head.in_features)
        return lambda: self.head(x)

    def _timed(self, rows: int, decode: bool, work) -> float:
        import torch

        from model_runner.loading.quantize import kernel_step

        with torch.inference_mode(), kernel_step() if decode else nullcontext():
            return best_of(self.device, 1, work)

    def measure(self, calls: list[tuple[str, int, bool]]) -> dict[tuple[str, int, bool], float]:
        """{(part, rows, decode): best seconds} for each ("layers" | "head" | "gemm", rows, decode), measured in
        rounds so a busy moment of a shared machine spoils one call of each rather than all calls of one; "gemm"
        (the float32 GEMM's rate at a size no step runs) times one layer and scales it by the layers."""
        works = {c: self._work(c) for c in calls}
        for call, work in works.items():
            self._timed(call[1], call[2], work)  # warm: kernel selection, allocation
        best = dict.fromkeys(calls, float("inf"))
        for _ in range(REPEATS):
            for call, work in works.items():
                best[call] = min(best[call], self._timed(call[1], call[2], work))
        return {c: (t * self.layers if c[0] == "gemm" else t) for c, t in best.items()}

    def layer_flops(self, rows: int) -> int:
        return 2 * rows * self.layers * sum(m.in_features * m.out_features for m in self.projections)
