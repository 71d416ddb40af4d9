"""Attention inspection: which cached positions an inspected request's newest query reads, per layer,
taken inside the model's own forward from its queries and the keys the paged pool hands back. The
kvscope attention function wraps transformers' sdpa: with no probe in the step it delegates unchanged;
with one it updates the cache itself, keeps softmax(q·Kᵀ·scaling + mask) for the probed rows' last
query, then runs the same sdpa on the same keys and values. A batch-invariant step (`PagedStep.row_by_row`)
reaches it with ROWS_KWARG: the same sdpa, row by row over each row's own keys."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from transformers import AttentionInterface
from transformers.generation.continuous_batching.cache import PagedAttentionCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from model_runner.local.model.paged_step import attend_row_by_row

IMPLEMENTATION = "kvscope_sdpa"  # the name the model's config carries once registered
PROBE_KWARG = "kvscope_probe"  # the model call's keyword that reaches every layer's attention
ROWS_KWARG = "kvscope_row_by_row"  # the same, for a batch-invariant step
# The paged call's packing arguments, which the row-by-row path reads or drops before calling sdpa.
PACKING = ("max_length_q", "max_length_k", "read_index", "write_index", "block_table", "is_causal")
TOP_K = 8  # positions sent per distribution, with their weights
BINS = 16  # a coarse histogram over all positions: the weight in each of up to BINS equal spans
DIGITS = 5  # weights are rounded on the wire: 1e-5 is far below what the page can show


def register() -> str:
    """Register the kvscope attention (and sdpa's mask for it) with transformers; idempotent."""
    AttentionInterface.register(IMPLEMENTATION, attention_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    return IMPLEMENTATION


@dataclass(frozen=True)
class ProbeRow:
    """One inspected row of a packed batch: where its last query sits and which keys are its own."""

    owner: int  # id() of the row's work, the key its summary is returned under
    query: int  # index of the row's last query token in the packed batch
    key_start: int  # its keys (cached positions 0 … n−1, in order) in the packed keys the cache returns
    key_end: int


class Probe:
    """Collects, layer by layer, each probed row's attention weights [heads, positions]."""

    def __init__(self, rows: list[ProbeRow]):
        self.rows = rows
        self.layers: list[list[torch.Tensor]] = []  # [layer][row] → [heads, positions], float32

    def capture(self, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scaling: float) -> None:
        """query [1, heads, Q, d] and key [1, kv_heads, K, d] as the attention sees them; mask [1, 1|heads, Q, K]."""
        kv_heads = key.shape[1]  # grouped-query attention: kv head j serves query heads j·g … j·g + g − 1
        per_row = []
        for row in self.rows:
            q = query[0, :, row.query].float().view(kv_heads, -1, query.shape[-1])  # [kv_heads, g, d]
            k = key[0, :, row.key_start : row.key_end].float()  # [kv_heads, n, d], no copy per query head
            scores = torch.einsum("kgd,knd->kgn", q, k).flatten(0, 1) * scaling  # [heads, n]
            if mask is not None:
                scores = scores + mask[0, :, row.query, row.key_start : row.key_end].float()
            per_row.append(torch.softmax(scores, dim=-1))
        self.layers.append(per_row)

    def weights(self) -> list[torch.Tensor]:
        """Per probed row: its weights [layers, heads, positions], on the CPU."""
        return [torch.stack([layer[i] for layer in self.layers]).cpu() for i in range(len(self.rows))]

    def summaries(self) -> dict[int, dict]:
        """owner → the compact summary of its row (see `summarize`), once the forward has run."""
        return {row.owner: summarize(w) for row, w in zip(self.rows, self.weights())}


def make_probe(owners: list[int | None], cu_q: list[int], cu_k: list[int]) -> Probe | None:
    """A probe for the rows whose owner is not None (row i: queries cu_q[i]…cu_q[i+1]−1, keys
    cu_k[i]…cu_k[i+1]−1 of the packed batch); None when no row is inspected, so nothing changes."""
    rows = [ProbeRow(o, cu_q[i + 1] - 1, cu_k[i], cu_k[i + 1]) for i, o in enumerate(owners) if o is not None]
    return Probe(rows) if rows else None


def attention_forward(module, query, key, value, attention_mask, *args, **kwargs):
    """transformers' attention signature. Without a probe or ROWS_KWARG: sdpa exactly as before."""
    probe: Probe | None = kwargs.pop(PROBE_KWARG, None)
    row_by_row = kwargs.pop(ROWS_KWARG, False)
    if probe is None and not row_by_row:
        return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)
    cache = kwargs.pop("cache", None)
    if isinstance(cache, PagedAttentionCache):  # the same update sdpa would make, so we see the keys it reads
        key, value = cache.update(key_states=key, value_states=value, layer_idx=module.layer_idx, kwargs=kwargs)
    if row_by_row:
        return _row_by_row(module, query, key, value, attention_mask, args, kwargs), None
    scaling = kwargs.get("scaling") or query.shape[-1] ** -0.5
    probe.capture(query, key, attention_mask, scaling)
    return sdpa_attention_forward(module, query, key, value, attention_mask, *args, **kwargs)


def _row_by_row(module, query, key, value, mask, args: tuple, kwargs: dict) -> torch.Tensor:
    """sdpa over each row's own keys (paged_step.attend_row_by_row) → [1, T, heads, d]."""
    cu_q = kwargs.pop("cu_seq_lens_q").tolist()
    cu_k = kwargs.pop("cu_seq_lens_k").tolist()
    for name in PACKING:
        kwargs.pop(name, None)

    def attend(q, keys, values, own_mask):
        return sdpa_attention_forward(module, q, keys, values, own_mask, *args, is_causal=False, **kwargs)[0]

    return attend_row_by_row(query, key, value, mask, cu_q, cu_k, attend)


# ---- the compact form sent on the wire -------------------------------------------------------------


def bin_width(positions: int) -> int:
    return max(1, math.ceil(positions / BINS))


def _compact(weights: torch.Tensor, width: int, with_bins: bool = True) -> list[dict]:
    """weights [rows, n] → per row {top: [[position, weight]…] by weight, bins: [weight per span]}."""
    n = weights.shape[-1]
    top = torch.topk(weights, min(TOP_K, n), dim=-1)
    spans = math.ceil(n / width)
    padded = torch.nn.functional.pad(weights, (0, spans * width - n))
    bins = padded.view(weights.shape[0], spans, width).sum(-1)
    out = []
    for i in range(weights.shape[0]):
        pairs = [[p, round(w, DIGITS)] for p, w in zip(top.indices[i].tolist(), top.values[i].tolist())]
        item = {"top": pairs}
        if with_bins:
            item["bins"] = [round(b, DIGITS) for b in bins[i].tolist()]
        out.append(item)
    return out


def sharpest_heads(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weights [layers, heads, n] → (head index, its entropy in nats) per layer. The sharpest head is
    the one with the lowest entropy: its weight is the most concentrated on few positions."""
    entropy = -(weights * weights.clamp_min(1e-30).log()).sum(-1)  # [layers, heads]
    best = entropy.argmin(-1)
    return best, entropy.gather(-1, best[:, None])[:, 0]


def summarize(weights: torch.Tensor) -> dict:
    """weights [layers, heads, n] of one query over its n cached positions → the compact summary:
    per layer the mean over heads (top positions and a histogram) and the sharpest head (top
    positions), plus "all": the mean over layers of the per-layer means."""
    n = weights.shape[-1]
    width = bin_width(n)
    mean = weights.mean(1)  # [layers, n]
    heads, entropy = sharpest_heads(weights)
    sharp = weights[torch.arange(weights.shape[0]), heads]  # [layers, n]
    means, sharps = _compact(mean, width), _compact(sharp, width, with_bins=False)
    layers = [
        {"mean": m, "sharpest": {"head": h, "entropy": round(e, 4), **s}}
        for m, s, h, e in zip(means, sharps, heads.tolist(), entropy.tolist())
    ]
    return {
        "positions": n,
        "query_position": n - 1,
        "bin_width": width,
        "all": _compact(mean.mean(0, keepdim=True), width)[0],
        "layers": layers,
    }
