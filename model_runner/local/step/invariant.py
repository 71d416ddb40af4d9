"""Batch-invariant decoding (the policy's `batch_invariant`): every forward a request takes runs at shapes set by
the request alone, so its logits are the same bits whatever else the engine is serving. Decode-shaped rows (one
token after a stored past) always run together at one fixed row count R, padded; every other row (a prompt,
a chunk of one) runs in a forward of its own; attention is reduced row by row over the row's own keys (each
step is a `PagedStep.row_by_row`: local/model/paged_step.py). What that rests on (a row's result at a fixed row
count does not depend on the other rows nor on its place among them) is a property of each kernel on the
route, checked when the mode is first switched on by `check_kernels` and reported."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from model_runner.loading.quantize import QUANTIZED, kernel_step
from model_runner.local.scheduler import Work

TRIALS = 2  # random companies per probed row position

# padded(rows, min_rows) → logits [len(rows), vocab] of a decode batch padded to min_rows (the static step),
# None when it does not fit the step's buffers
Padded = Callable[[list[Work], int], "torch.Tensor | None"]
# alone(rows) → logits [wanting rows, vocab] of rows at their own shapes (the eager forward)
Alone = Callable[[list[Work]], torch.Tensor]


@dataclass
class KernelCheck:
    """What the start-up check found for one kind of layer on the route, at the mode's row count."""

    layer: str  # e.g. "Int4Linear 576→1536"
    row_independent: bool  # a row's output was the same bits at every place among R rows, in any company


@dataclass
class Invariance:
    """The mode's report: its row count, what each kernel gave, and so whether batch invariance is claimed."""

    rows: int
    checks: list[KernelCheck] = field(default_factory=list)
    prefix_caching: str = "off: a prefix computed inside another request's prompt is other bits"
    preemption: str = "replayed: the prompt again at its own shapes, then each answer token as a decode row"

    @property
    def claimed(self) -> bool:
        return all(check.row_independent for check in self.checks)

    def to_dict(self) -> dict:
        failed = [c.layer for c in self.checks if not c.row_independent]
        return {
            "on": True,
            "rows": self.rows,
            "claimed": self.claimed,
            "not_row_independent": failed,
            "kernels_checked": len(self.checks),
            "attention": "row by row over each row's own keys",
            "prompts": "each prompt (or chunk of one) in a forward of its own",
            "prefix_caching": self.prefix_caching,
            "preemption": self.preemption,
            "inspection": "off (an inspected row would leave the fixed row count)",
        }


def _layer_name(layer: nn.Module) -> str:
    return f"{type(layer).__name__} {layer.in_features}→{layer.out_features}"


def _row_independent(layer: nn.Module, rows: int, generator: torch.Generator) -> bool:
    """Whether one input row gives the same output bits at each of `rows` places, among random other rows."""
    dtype = next((t.dtype for t in layer.parameters()), torch.float32) if not isinstance(layer, QUANTIZED) else None
    probe = torch.randn(layer.in_features, generator=generator, dtype=dtype or torch.float32)
    seen = None
    for place in range(rows):
        for trial in range(TRIALS):
            batch = torch.randn(rows, layer.in_features, generator=generator, dtype=probe.dtype) * (trial + 1)
            batch[place] = probe
            out = layer(batch)[place]
            if seen is None:
                seen = out
            elif not torch.equal(seen, out):
                return False
    return True


def check_kernels(model: nn.Module, rows: int) -> Invariance:
    """Probe each distinct linear layer of the model (kind and shape: the int4 and int8 kernels, the float
    GEMM, the head with its float32 rescoring) at `rows` rows, as a decode step runs them (on the kernels)."""
    report = Invariance(rows=rows)
    generator = torch.Generator().manual_seed(0)
    seen: set[str] = set()
    with torch.inference_mode(), kernel_step():
        for layer in model.modules():
            if not isinstance(layer, (nn.Linear, *QUANTIZED)):
                continue
            name = _layer_name(layer)
            if name in seen:
                continue
            seen.add(name)  # int4 siblings run their group's one call, as in a decode step
            report.checks.append(KernelCheck(name, _row_independent(layer, rows, generator)))
    return report


class InvariantSteps:
    """The mode's dispatch of one engine step: the decode-shaped rows in groups of exactly `rows` (padded by
    the static step), each other row alone (the eager forward over one row), logits back in row order."""

    def __init__(self, rows: int, padded: Padded, alone: Alone):
        self.rows, self.padded, self.alone = rows, padded, alone

    @staticmethod
    def decode_shaped(row: Work) -> bool:
        """One token after a stored past: a decode, or a preempted request replaying its answer token by token."""
        return len(row.tokens) == 1 and row.seq.cached > 0

    def __call__(self, rows: list[Work]) -> torch.Tensor:
        """rows → logits of the rows that want them, in row order ([n_wanting, vocab])."""
        by_row = self._run(rows)
        wanting = [by_row[id(row)] for row in rows if row.wants_logits]
        return torch.stack(wanting) if wanting else torch.empty(0)

    def _run(self, rows: list[Work]) -> dict[int, torch.Tensor]:
        by_row: dict[int, torch.Tensor] = {}
        decodes = [row for row in rows if self.decode_shaped(row)]
        for start in range(0, len(decodes), self.rows):
            group = decodes[start : start + self.rows]
            with kernel_step():
                logits = self.padded(group, self.rows)
            if logits is None:
                raise RuntimeError(f"a decode group of {len(group)} rows does not fit the padded step's buffers")
            by_row.update({id(row): logits[i] for i, row in enumerate(group)})
        for row in rows:
            if not self.decode_shaped(row):
                logits = self.alone([row])
                if row.wants_logits:
                    by_row[id(row)] = logits[-1]
        return by_row
