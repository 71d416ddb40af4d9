"""Batch-invariant decoding (`--batch-invariant`): every forward a request takes runs at shapes set by the
request alone, so its logits are the same bits whatever else the engine is serving. Decode-shaped rows (one
token after a stored past) always run together at one fixed row count R, padded; every other row (a prompt,
a chunk of one) runs in a forward of its own; attention is reduced row by row over the row's own keys. What
that rests on (a row's result at a fixed row count does not depend on the other rows nor on its place among
them) is a property of each kernel on the route, checked at start-up by `check_kernels` and reported."""

from __future__ import annotations

import contextvars
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.generation.continuous_batching.cache import PagedAttentionCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from model_runner.loading.quantize import QUANTIZED, kernel_step
from model_runner.local.model.attention_inspect import attention_forward as default_attention_forward
from model_runner.local.scheduler import Work

IMPLEMENTATION = "kvscope_row_attention"  # the model's attention while an engine runs in the mode
TRIALS = 2  # random companies per probed row position

# Set around the mode's forwards. The model object may be shared (tests, the speculative experiment on a
# request's thread): a call outside the mode's forwards runs kvscope's default attention, unchanged.
_ROW_BY_ROW = contextvars.ContextVar("kvscope_row_by_row", default=False)


def register() -> str:
    """Register the row-by-row attention (with sdpa's mask) with transformers; idempotent."""
    AttentionInterface.register(IMPLEMENTATION, row_attention_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    return IMPLEMENTATION


def use_row_attention(model) -> None:
    """Make the model's attention the mode's (a default engine on the same model may have set its own)."""
    if model.config._attn_implementation != IMPLEMENTATION:
        model.set_attn_implementation(register())


@contextmanager
def row_by_row():
    token = _ROW_BY_ROW.set(True)
    try:
        yield
    finally:
        _ROW_BY_ROW.reset(token)


def row_by_row_active() -> bool:
    """Whether the forward running now is one of the mode's (the native step reads it: local/model/native.py)."""
    return _ROW_BY_ROW.get()


def row_attention_forward(module, query, key, value, attention_mask, *args, **kwargs):
    """transformers' attention signature, over a packed batch of rows: each row's queries against its own
    keys only (sliced out of the packed keys, copied to a tensor of their own), so a row's softmax and its
    weighted sum of values are taken over the same numbers in the same order whoever shares the step. A
    row with no keys (the padding of a fixed row count) gets zeros. Outside the mode's forwards: kvscope's
    default attention."""
    if not _ROW_BY_ROW.get():
        return default_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    cache = kwargs.pop("cache", None)
    if isinstance(cache, PagedAttentionCache):
        key, value = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx, kwargs=kwargs)
    cu_q = kwargs.pop("cu_seq_lens_q").tolist()
    cu_k = kwargs.pop("cu_seq_lens_k").tolist()
    for name in ("max_length_q", "max_length_k", "read_index", "write_index", "block_table", "is_causal"):
        kwargs.pop(name, None)
    outputs = []
    for row in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[row], cu_q[row + 1], cu_k[row], cu_k[row + 1]
        if q1 == q0:
            continue
        q = query[:, :, q0:q1].contiguous()
        if k1 == k0:  # padding: sees nothing, and nothing sees it
            outputs.append(q.new_zeros(1, q1 - q0, query.shape[1], query.shape[-1]))
            continue
        mask = None if q1 - q0 == 1 else attention_mask[:, :, q0:q1, k0:k1].contiguous()
        out, _ = sdpa_attention_forward(
            module,
            q,
            key[:, :, k0:k1].contiguous(),
            value[:, :, k0:k1].contiguous(),
            mask,
            *args,
            is_causal=False,
            **kwargs,
        )
        outputs.append(out)
    return torch.cat(outputs, dim=1), None


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

    def __init__(self, forward, rows: int):
        self.forward, self.rows = forward, rows  # a BatchForward with a static step

    @staticmethod
    def decode_shaped(row: Work) -> bool:
        """One token after a stored past: a decode, or a preempted request replaying its answer token by token."""
        return len(row.tokens) == 1 and row.seq.cached > 0

    def __call__(self, rows: list[Work]) -> torch.Tensor:
        """rows → logits of the rows that want them, in row order ([n_wanting, vocab])."""
        use_row_attention(self.forward.model)
        with row_by_row():
            by_row = self._run(rows)
        wanting = [by_row[id(row)] for row in rows if row.wants_logits]
        return torch.stack(wanting) if wanting else torch.empty(0)

    def _run(self, rows: list[Work]) -> dict[int, torch.Tensor]:
        by_row: dict[int, torch.Tensor] = {}
        decodes = [row for row in rows if self.decode_shaped(row)]
        for start in range(0, len(decodes), self.rows):
            group = decodes[start : start + self.rows]
            with kernel_step():
                logits = self._padded(group)
            by_row.update({id(row): logits[i] for i, row in enumerate(group)})
        for row in rows:
            if not self.decode_shaped(row):
                logits = self.forward._eager([row])
                if row.wants_logits:
                    by_row[id(row)] = logits[-1]
        return by_row

    def _padded(self, group: list[Work]) -> torch.Tensor:
        static = self.forward.static
        bucket = static.fill(group, min_rows=self.rows)
        if bucket is None:
            raise RuntimeError(f"a decode group of {len(group)} rows does not fit the padded step's buffers")
        logits = static.run(bucket)
        for row in group:
            row.seq.cached += 1
        self.forward.static_steps += 1
        return logits[: len(group)]
