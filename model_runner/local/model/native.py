"""The native decoder step for the Llama family (Llama, SmolLM2, Qwen2, Qwen3): one plain-torch function runs
a packed step of the engine over its paged KV pool — RMSNorm, rotary embeddings, grouped-query attention by
`scaled_dot_product_attention`, the SiLU-gated MLP — on the model's own modules' weights and the route's
weight kernels, without the framework's per-layer machinery. Each op is the one transformers' Llama forward
runs, in the same order and on tensors of the same shapes, so its logits are transformers' bits at the same
shapes; a decode step of several rows attends each row over its own keys (DecodeRows), and so does a CPU step
of several prompts or chunks where the pairs it saves pay for the calls (paged_step.rows_apart_pay), each within
rounding of the packed batch (tests/unit/test_native_decoder.py, tests/model/test_native_decoder_model.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers.activations import SiLUActivation
from transformers.integrations.sdpa_attention import pack_gqa, repeat_kv, use_gqa_in_sdpa
from transformers.modeling_utils import slice_logits_to_keep

from model_runner.loading.quantize import MM_DTYPE, decode_kernel, int4_mm
from model_runner.local.kv_cache import FULL
from model_runner.local.model.paged_step import PagedStep, RowBounds, attend_row_by_row, rows_apart_pay

FAMILIES = ("llama", "qwen2", "qwen3")  # config.model_type of the decoder layers this step runs (Qwen3: head norms)
SILU = (SiLUActivation, nn.SiLU)  # transformers' "silu" and "swish": both nn.functional.silu


def native_support(model) -> str | None:
    """None when the native step runs `model` exactly as transformers does; else why it does not."""
    base = llama_of(model)
    config = base.config
    kind = getattr(config, "model_type", "?")
    if kind not in FAMILIES:
        return f"its architecture ({kind}) is not one the native step knows ({', '.join(FAMILIES)})"
    activation = base.model.layers[0].mlp.act_fn
    if not isinstance(activation, SILU):
        return f"its MLP's activation is {type(activation).__name__}, not SiLU"
    layer_types = set(getattr(config, "layer_types", None) or [FULL])
    if layer_types != {FULL}:
        return f"it has {', '.join(sorted(layer_types - {FULL}))} layers (the native step runs full attention only)"
    return None


def llama_of(model) -> nn.Module:
    """The transformers *ForCausalLM under the engine's model (the test model wraps one)."""
    return getattr(model, "base", model)


@dataclass(frozen=True, slots=True)
class Norm:
    """An RMSNorm's weight and epsilon, read once from transformers' module."""

    weight: torch.Tensor
    eps: float

    @classmethod
    def of(cls, module: nn.Module) -> Norm:
        return cls(module.weight, module.variance_epsilon)


def rms_norm(norm: Norm, x: torch.Tensor) -> torch.Tensor:
    """transformers' LlamaRMSNorm: float32 statistics, the weight applied in x's dtype. In float32, torch's
    rms_norm takes the same ops in one call (the same bits: the native step's tests compare them); in another
    dtype, transformers' ops one by one. (Qwen3's per-head norms are called as modules: two calls a layer.)"""
    if x.dtype == norm.weight.dtype == torch.float32:
        return nn.functional.rms_norm(x, norm.weight.shape, norm.weight, norm.eps)
    dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + norm.eps)
    return norm.weight * x.to(dtype)


def rotation(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's rotary factors [1, 1, T, d] for `rotate`: cos, and sin with its first half negated, so that
    rotate(x) = x·cos + roll(x)·sin' is transformers' x·cos + rotate_half(x)·sin bit for bit (a sign moved from
    one factor of a product to the other changes no bit) in four ops instead of seven."""
    half = sin.shape[-1] // 2
    signed = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
    return cos[:, None], signed[:, None]


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x [1, heads, T, d] rotated by its tokens' positions (factors from `rotation`)."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


@dataclass(frozen=True, slots=True)
class Layer:
    """One decoder layer's parts, looked up once (a module attribute costs a dictionary walk a call): its norms,
    its linear layers, Qwen3's head norms, and its pages of the pool."""

    attention_norm: Norm
    mlp_norm: Norm
    qkv: tuple  # q_proj, k_proj, v_proj modules
    o_proj: object  # a linear layer's forward
    gate_up: tuple  # gate_proj, up_proj modules
    down_proj: object
    q_norm: nn.Module | None  # Qwen3's per-head norms of q and k
    k_norm: nn.Module | None
    k_cache: torch.Tensor  # [slots, kv_heads, d]: the pool's token view of this layer's keys
    v_cache: torch.Tensor
    # (packed weights, scales) of the int4 calls a decode step makes, in order: q|k|v joined, o, gate|up
    # joined, down (quantize.decode_kernel); None unless all four are bias-free int4 calls
    kernels: tuple | None

    @classmethod
    def of(cls, layer: nn.Module, kv: tuple[torch.Tensor, torch.Tensor]) -> Layer:
        attn, mlp = layer.self_attn, layer.mlp
        qkv, gate_up = (attn.q_proj, attn.k_proj, attn.v_proj), (mlp.gate_proj, mlp.up_proj)
        kernels = tuple(_group_kernel(group) for group in (qkv, (attn.o_proj,), gate_up, (mlp.down_proj,)))
        even = mlp.gate_proj.out_features == mlp.up_proj.out_features  # _decode_layer halves gate|up
        return cls(
            Norm.of(layer.input_layernorm),
            Norm.of(layer.post_attention_layernorm),
            qkv,
            attn.o_proj.forward,
            gate_up,
            mlp.down_proj.forward,
            getattr(attn, "q_norm", None),
            getattr(attn, "k_norm", None),
            *kv,
            kernels if None not in kernels and even and getattr(attn, "q_norm", None) is None else None,
        )


def _group_kernel(group: tuple) -> tuple | None:
    """quantize.decode_kernel of one layer, or of siblings joined as exactly this group (q, k, v; gate, up)."""
    if len(group) == 1:
        return decode_kernel(group[0])
    siblings = getattr(group[0], "siblings", None)
    return decode_kernel(siblings) if siblings is not None and tuple(siblings.layers) == group else None


def project(layers: tuple, x: torch.Tensor) -> tuple[torch.Tensor | None, list[torch.Tensor]]:
    """Linear layers that read the same input, on x [1, T, D] → (their outputs side by side [1, T, Σ out] when
    one int4 call made them all (loading/quantize.py Int4Siblings.joined), else None; each output [1, T, out])."""
    siblings = getattr(layers[0], "siblings", None)
    joined = siblings.joined(x) if siblings is not None and tuple(siblings.layers) == layers else None
    if joined is None:
        return None, [layer.forward(x) for layer in layers]
    joined = joined.view(*x.shape[:-1], -1)
    return joined, list(joined.split(siblings.widths, dim=-1))


def before_attention(
    h: torch.Tensor, norm: Norm, qkv_kernel: tuple, cos: torch.Tensor, sin: torch.Tensor, head_dim: int, qk_width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A decode layer's ops on int4 kernels up to attention, h [1, R, D] → q's and k's heads rotated side by side
    [1, H + KV, R, d] and v [R, KV·d] (NativeLlama._decode_layer; pure, so it can be compiled apart). h is
    float32 (NativeLlama._on_decode_kernels), so h.dtype is the residual's and the modules' output dtype."""
    tokens, width = h.shape[1], h.shape[2]
    qkv = int4_mm(rms_norm(norm, h).view(tokens, width), *qkv_kernel, h.dtype)  # [R, q|k|v]
    qk = rotate(qkv[:, :qk_width].view(1, tokens, -1, head_dim).transpose(1, 2), cos, sin)  # [1, H + KV, R, d]
    return qk, qkv[:, qk_width:]


def after_attention(
    h: torch.Tensor, out: torch.Tensor, o_kernel: tuple, norm: Norm, gate_up_kernel: tuple, down_kernel: tuple
) -> torch.Tensor:
    """A decode layer's ops on int4 kernels after attention, h [1, R, D] and attention's out [R, H·d] → the
    layer's output [1, R, D]: o, the residual, the MLP's norm, gate|up, the SiLU gate, down, the residual."""
    tokens, width = h.shape[1], h.shape[2]
    # the residual adds take the kernel's bfloat16 output as it is: the add runs in h's float32 and widening
    # bfloat16 is exact, so the bits are those of casting first, one op fewer each
    h = h + int4_mm(out, *o_kernel, MM_DTYPE).view(1, tokens, width)
    gate, up = int4_mm(rms_norm(norm, h).view(tokens, width), *gate_up_kernel, h.dtype).chunk(2, dim=-1)
    return h + int4_mm(nn.functional.silu(gate) * up, *down_kernel, MM_DTYPE).view(1, tokens, width)


PACKED, ROW_BY_ROW = "packed", "row by row"  # how a step's queries meet their keys, besides DecodeRows


class NativeLlama:
    """The native step over a transformers Llama-family model's modules and the engine's pool. `run(step)`
    → logits [kept tokens, vocab]; it writes each new token's K and V into the pool as it goes."""

    name = "native"

    def __init__(self, model, pool):
        why = native_support(model)
        if why is not None:
            raise ValueError(f"the native decoder cannot run this model: {why}")
        base = llama_of(model)
        config, body = base.config, base.model
        self.embed, self.rotary, self.norm, self.head = (
            body.embed_tokens,
            body.rotary_emb,
            Norm.of(body.norm),
            base.lm_head,
        )
        layers = list(body.layers[: config.num_hidden_layers])
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.groups = self.heads // self.kv_heads
        self.scaling = layers[0].self_attn.scaling
        allocator = pool.cache.cache_allocators[FULL]
        self.read_trash = allocator.read_trash_index  # a slot never written: zeros, what padding keys read
        # Each layer's K and V token views of the pool's flat tensor: [slots, kv_heads, head_dim].
        self.layers = [Layer.of(layer, allocator._kv_token_views[layer.self_attn.layer_idx]) for layer in layers]
        self.v_after_k = values_after_keys(self.layers)
        self.all_int4 = all(layer.kernels is not None for layer in self.layers)  # every layer's four calls int4
        self.qk_width = (self.heads + self.kv_heads) * self.head_dim  # q's and k's outputs, before v's
        # A decode layer's stretches around attention on int4 kernels, read once a step: eager, or compiled ahead of
        # time once a library gives their bits (local/model/compiled.py; scripts/compile_probe.py measures both)
        self.stretches = (before_attention, after_attention)

    def inspects(self) -> bool:
        return True  # every step can hand its queries and keys to an attention probe

    def needs_mask(self, step: PagedStep) -> bool:
        """Whether `step` needs its packed [1, 1, T, K] mask: not when its decode rows attend alone."""
        return self._attention(step) is not DecodeRows

    def run(self, step: PagedStep) -> torch.Tensor:
        h = self.embed(step.ids[None])  # [1, T, D]
        # cos, sin [1, T, d]: the model's own rotary module (its scaling rule), once a step
        cos, sin = rotation(*self.rotary(h, position_ids=step.positions[None]))
        mode = self._attention(step)
        if mode is DecodeRows:
            attend = DecodeRows(step, self.head_dim, self.read_trash, h.dtype)
        else:  # packed, or row by row on the rows' bounds read to the host once a step, not once a layer
            attend = RowBounds.of(step) if mode == ROW_BY_ROW else mode
        if self._on_decode_kernels(attend, h):
            stretches = self.stretches
            for layer in self.layers:
                h = self._decode_layer(layer, h, cos, sin, step, attend, stretches)
        else:
            for layer in self.layers:
                h = self._layer(layer, h, cos, sin, step, attend)
        kept = slice_logits_to_keep(rms_norm(self.norm, h), step.keep)  # [1, N, D], as transformers slices
        return self.head(kept)[0]  # [N, vocab]

    @staticmethod
    def _attention(step: PagedStep):
        """How this step's queries meet their keys: row by row in batch-invariant mode; when nothing is
        inspected, each decode row over its own gathered keys (DecodeRows: no block-diagonal waste, no key head
        copied per query head) if the step is decode tokens only, and row by row where rows_apart_pay (a CPU
        step whose saved pairs pay for the calls); else the packed batch under its mask."""
        if step.row_by_row:
            return ROW_BY_ROW
        if step.probe is not None:  # an inspected step keeps transformers' shapes, whose bits the probe reads
            return PACKED
        if step.decode_rows:
            return DecodeRows
        return ROW_BY_ROW if rows_apart_pay(step) else PACKED

    def _on_decode_kernels(self, attend, h: torch.Tensor) -> bool:
        """Whether this step's layers, on h [1, R, D], may call their int4 kernels directly (`_decode_layer`):
        decode rows that attend alone, a float32 residual (the route's), every layer's four calls bias-free int4
        ones, rows the kernels take (not a prompt's float weights: quantize.Int4Siblings.joins; one layer asks
        for all, as quantize_int4 keeps float weights for every layer or none), and sdpa's packed grouped
        heads, as `_attend` would choose them."""
        if not isinstance(attend, DecodeRows) or h.dtype != torch.float32 or not self.all_int4:
            return False
        first = self.layers[0]
        return first.qkv[0].siblings.joins(h.view(-1, h.shape[-1])) and not (
            self.groups > 1 and use_gqa_in_sdpa(attend.mask, first.k_cache, first.v_cache)
        )

    def _decode_layer(self, layer: Layer, h, cos, sin, step: PagedStep, rows: DecodeRows, stretches) -> torch.Tensor:
        """`_layer` for a step of decode rows on int4 kernels, h [1, R, D] → [1, R, D]: the same ops on the same
        shapes (so the same bits: tests/unit/test_native_decoder.py), minus the modules' dispatch and checks,
        made once a step rather than four times a layer. Writes the step's K and V into this layer's pages."""
        qkv_kernel, o_kernel, gate_up_kernel, down_kernel = layer.kernels
        before_attention, after_attention = stretches
        qk, v = before_attention(h, layer.attention_norm, qkv_kernel, cos, sin, self.head_dim, self.qk_width)
        layer.k_cache.index_copy_(0, step.write, qk[0, self.heads :].transpose(0, 1))  # [R, kv_heads, d]
        layer.v_cache.index_copy_(0, step.write, v.view(-1, self.kv_heads, self.head_dim))
        out = rows.attend_grouped(qk[:, : self.heads], layer.k_cache, layer.v_cache, self.scaling, self.v_after_k)
        return after_attention(h, out, o_kernel, layer.mlp_norm, gate_up_kernel, down_kernel)

    def _layer(self, layer: Layer, h, cos, sin, step: PagedStep, attend) -> torch.Tensor:
        """One decoder layer on h [1, T, D] → [1, T, D]; writes the step's K and V into this layer's pages."""
        x = rms_norm(layer.attention_norm, h)
        qk, v = self._project_qkv(layer, x)  # [1, T, heads + kv_heads, d], [1, kv_heads, T, d]
        qk = rotate(qk.transpose(1, 2), cos, sin)  # q's heads and k's rotated together: [1, heads + kv_heads, T, d]
        q, k = qk[:, : self.heads], qk[:, self.heads :]  # [1, heads, T, d], [1, kv_heads, T, d]
        if isinstance(attend, DecodeRows):  # write, then gather each row's keys
            self._write(k, v, layer.k_cache, layer.v_cache, step)
            out = attend.attend(q, layer.k_cache, layer.v_cache, self._attend)
        else:
            keys, values = self._cache(k, v, layer.k_cache, layer.v_cache, step)  # [1, kv_heads, K, d]
            if step.probe is not None:
                step.probe.capture(q, keys, step.mask, self.scaling)
            if isinstance(attend, RowBounds):
                out = self._attend_rows(q, keys, values, step.mask, attend)
            else:
                out = self._attend(q, keys, values, step.mask)  # [1, T, heads, d]
        h = h + layer.o_proj(out.reshape(*h.shape[:-1], -1).contiguous())
        _, (gate, up) = project(layer.gate_up, rms_norm(layer.mlp_norm, h))
        return h + layer.down_proj(nn.functional.silu(gate) * up)

    def _project_qkv(self, layer: Layer, x) -> tuple[torch.Tensor, torch.Tensor]:
        """x [1, T, D] → q's and k's heads side by side [1, T, heads + kv_heads, d] (Qwen3: each head normalized
        first) and v [1, kv_heads, T, d]. A joined int4 call already holds them side by side; else q, k are cat."""
        tokens = x.shape[1]
        joined, outputs = project(layer.qkv, x)
        q, k, v = (t.view(1, tokens, -1, self.head_dim) for t in outputs)
        if layer.q_norm is not None:
            q, k = layer.q_norm(q), layer.k_norm(k)
        elif joined is not None:  # [1, T, q | k | v]: q's and k's heads are its first heads + kv_heads
            qk = joined[..., : (self.heads + self.kv_heads) * self.head_dim]
            return qk.view(1, tokens, -1, self.head_dim), v.transpose(1, 2)
        return torch.cat((q, k), dim=2), v.transpose(1, 2)

    @staticmethod
    def _write(k, v, k_cache, v_cache, step: PagedStep) -> None:
        """The step's k, v [1, kv_heads, T, d] into their pool slots."""
        k_cache.index_copy_(0, step.write, k.squeeze(0).transpose(0, 1))
        v_cache.index_copy_(0, step.write, v.squeeze(0).transpose(0, 1))

    def _cache(self, k, v, k_cache, v_cache, step: PagedStep) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the step's k, v [1, kv_heads, T, d] to their slots; → every row's keys and values as read
        back from the pool, [1, kv_heads, K, d] (the new ones alone when no row has a past)."""
        self._write(k, v, k_cache, v_cache, step)
        if not step.read.numel():
            return k, v
        k, v = k_cache.index_select(0, step.read), v_cache.index_select(0, step.read)  # [K, kv_heads, d]
        return k.transpose(0, 1)[None], v.transpose(0, 1)[None]

    def _attend(self, q, keys, values, mask) -> torch.Tensor:
        """sdpa with the grouped heads arranged as transformers' sdpa integration arranges them (its own rule:
        sdpa's grouped-query mode where the device takes it, else one query's heads packed per key head, else
        the keys repeated). q [b, heads, T, d], keys and values [b, kv_heads, K, d] → [b, T, heads, d]."""
        batch, tokens, grouped = q.shape[0], q.shape[2], {}
        if self.groups > 1 and use_gqa_in_sdpa(mask, keys, values):
            grouped["enable_gqa"] = True
        elif self.groups > 1 and tokens == 1:
            q, mask = pack_gqa(q, self.groups), pack_gqa(mask, self.groups)  # [b, kv_heads, groups, d]
        elif self.groups > 1:
            keys, values = repeat_kv(keys, self.groups), repeat_kv(values, self.groups)
        out = nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling, **grouped)
        return out.reshape(batch, -1, tokens, self.head_dim).transpose(1, 2).contiguous()

    def _attend_rows(self, q, keys, values, mask, bounds: RowBounds) -> torch.Tensor:
        """Each row's queries over its own keys only, at shapes of its own (paged_step.attend_row_by_row): batch-
        invariant mode's attention, and a CPU step's where rows_apart_pay; a row with no keys (padding) gets zeros."""
        return attend_row_by_row(q, keys, values, mask, bounds.cu_q, bounds.cu_k, self._attend)


def values_after_keys(layers: list[Layer]) -> int | None:
    """How many slots of a layer's key view its value view starts after, when that is one count for every layer
    and the key view runs on over the values (the pool's layout: a layer's K pages, then its V pages): one
    gather from the key view at slots and slots + that count then reads both. None where the layout differs."""
    counts = set()
    for layer in layers:
        k, v = layer.k_cache, layer.v_cache
        row = k.stride(0) * k.element_size()
        offset, rest = divmod(v.data_ptr() - k.data_ptr(), row)
        # equal strides over views of one flat tensor: the same [kv_heads, d] rows, so k[offset + s] is v[s]
        runs_on = k.stride() == v.stride() and 0 < offset and not rest and offset + v.shape[0] <= k.shape[0]
        counts.add(offset if runs_on else None)
    return counts.pop() if len(counts) == 1 else None


class DecodeRows:
    """A decode step's rows (one query each) side by side: row r's keys are its own L_r cached positions,
    gathered into [R, kv_heads, L, d] (L the longest row's count, the rest padded with the read-trash slot,
    zeros, and masked), so attention costs R·L instead of the packed batch's R·ΣL and no key head is copied per
    query head. One row alone is transformers' own decode attention (the same shapes and mask). A row's bits
    do not depend on what the other rows hold, but may on their lengths (L sets how sdpa blocks its sums)."""

    def __init__(self, step: PagedStep, head_dim: int, pad_slot: int, dtype: torch.dtype):
        cu = step.cu_k.long()
        lengths = cu[1:] - cu[:-1]  # [R]
        width = step.max_k
        cols = torch.arange(width, device=cu.device)
        seen = cols[None, :] < lengths[:, None]  # [R, L]
        at = (cu[:-1, None] + cols[None, :]).clamp_(max=step.read.numel() - 1)
        self.slots = step.read[at].masked_fill_(~seen, pad_slot).flatten()  # [R·L] pool slots
        zero = torch.zeros((), dtype=dtype, device=cu.device)
        self.mask = torch.where(seen, zero, torch.finfo(dtype).min)[:, None, None, :]  # [R, 1, 1, L]
        self.rows, self.width, self.head_dim = lengths.numel(), width, head_dim
        self.both: torch.Tensor | None = None  # [2·R·L] the key view's slots of the keys, then of the values

    def _gathered(self, cache: torch.Tensor) -> torch.Tensor:
        """Each row's keys (or values) from a layer's pool view → [R, kv_heads, L, d]."""
        return cache.index_select(0, self.slots).view(self.rows, self.width, -1, self.head_dim).transpose(1, 2)

    def attend_grouped(self, q, k_cache, v_cache, scale: float, v_after_k: int | None) -> torch.Tensor:
        """`attend` as NativeLlama._attend runs it for one query a row (each key head's query heads packed as
        its queries, transformers' pack_gqa), q [1, heads, R, d] → [R, heads·d], a row's heads side by side.
        With `v_after_k` (values_after_keys) the keys and values come in one gather from the key view."""
        if v_after_k is None:
            keys, values = self._gathered(k_cache), self._gathered(v_cache)
        else:
            if self.both is None:  # once a step: every layer's pool views share the layout
                self.both = torch.cat((self.slots, self.slots + v_after_k))
            both = k_cache.index_select(0, self.both).view(2, self.rows, self.width, -1, self.head_dim)
            keys, values = both.transpose(2, 3).unbind(0)  # each [R, kv_heads, L, d]
        grouped = q.transpose(0, 2).reshape(self.rows, keys.shape[1], -1, self.head_dim)  # [R, kv_heads, groups, d]
        out = nn.functional.scaled_dot_product_attention(grouped, keys, values, attn_mask=self.mask, scale=scale)
        return out.reshape(self.rows, -1)

    def attend(self, q, k_cache, v_cache, attend) -> torch.Tensor:
        """q [1, heads, R, d] (row r's query at index r) → [1, R, heads, d]."""
        keys, values = self._gathered(k_cache), self._gathered(v_cache)  # [R, kv_heads, L, d]
        out = attend(q.transpose(0, 2), keys, values, self.mask)  # [R, 1, heads, d]
        return out.transpose(0, 1)  # [1, R, heads, d]
