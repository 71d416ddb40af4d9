"""The native decoder step for the Llama family (Llama, SmolLM2, Qwen2, Qwen3): one plain-torch function runs
a packed step of the engine over its paged KV pool — RMSNorm, rotary embeddings, grouped-query attention by
`scaled_dot_product_attention`, the SiLU-gated MLP — on the model's own modules' weights and the route's
weight kernels, without the framework's per-layer machinery. Each op is the one transformers' Llama forward
runs, in the same order and on tensors of the same shapes, so its logits are transformers' bits at the same
shapes (tests/unit/test_native_decoder.py, tests/model/test_native_decoder_model.py)."""

from __future__ import annotations

import time

import torch
from torch import nn

from model_runner.local import invariant
from model_runner.local.kv_cache import FULL
from model_runner.local.paged_step import PagedStep

# The families whose decoder layer is this step's (config.model_type), each with what it adds to Llama's.
FAMILIES = {"llama": "", "qwen2": "biases on q, k, v", "qwen3": "an RMSNorm on each head of q and k"}


def native_support(model) -> str | None:
    """None when the native step runs `model` exactly as transformers does; else why it does not."""
    base = llama_of(model)
    config = base.config
    kind = getattr(config, "model_type", "?")
    if kind not in FAMILIES:
        return f"its architecture ({kind}) is not one the native step knows (llama, qwen2, qwen3)"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"its MLP's activation is {config.hidden_act}, not SiLU"
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {FULL}:
        return f"it has {', '.join(sorted(layer_types - {FULL}))} layers (the native step runs full attention only)"
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return "it splits its linear layers for tensor-parallel pretraining (pretraining_tp > 1)"
    return None


def llama_of(model) -> nn.Module:
    """The transformers *ForCausalLM under the engine's model (the test model wraps one)."""
    return getattr(model, "base", model)


def rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """transformers' LlamaRMSNorm, op for op: float32 statistics, the weight applied in x's dtype."""
    dtype = x.dtype
    x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + norm.variance_epsilon)
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


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[1, kv_heads, K, d] → [1, kv_heads · groups, K, d]: each key head once per query head it serves."""
    batch, heads, keys, dim = x.shape
    return x[:, :, None].expand(batch, heads, groups, keys, dim).reshape(batch, heads * groups, keys, dim)


class NativeLlama:
    """The native step over a transformers Llama-family model's modules and the engine's pool. `run(step)`
    → logits [kept tokens, vocab]; it writes each new token's K and V into the pool as it goes."""

    def __init__(self, model, pool):
        why = native_support(model)
        if why is not None:
            raise ValueError(f"the native decoder cannot run this model: {why}")
        self.model = model  # the test model's stand-in step time is read from it each step
        base = llama_of(model)
        config = base.config
        self.body, self.head = base.model, base.lm_head
        self.layers = list(self.body.layers[: config.num_hidden_layers])
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.groups = self.heads // self.kv_heads
        self.scaling = self.layers[0].self_attn.scaling
        allocator = pool.cache.cache_allocators[FULL]
        # Each layer's K and V token views of the pool's flat tensor: [slots, kv_heads, head_dim].
        self.kv = [allocator._kv_token_views[layer.self_attn.layer_idx] for layer in self.layers]

    def run(self, step: PagedStep) -> torch.Tensor:
        delay = getattr(self.model, "delay_s", 0)
        if delay:  # the test model stands in for a bigger model's step time
            time.sleep(delay)
        h = self.body.embed_tokens(step.ids[None])  # [1, T, D]
        # cos, sin [1, T, d]: the model's own rotary module (its scaling rule), once a step
        cos, sin = rotation(*self.body.rotary_emb(h, position_ids=step.positions[None]))
        attend = self._attention(step)
        for layer, (k_cache, v_cache) in zip(self.layers, self.kv):
            h = self._layer(layer, h, cos, sin, k_cache, v_cache, step, attend)
        h = rms_norm(self.body.norm, h)
        kept = h if isinstance(step.keep, int) and step.keep == 0 else h[:, step.keep]  # [1, N, D]
        return self.head(kept)[0]  # [N, vocab]

    def _attention(self, step: PagedStep):
        """How this step's queries meet their keys, chosen once a step: row by row in batch-invariant mode;
        each decode row over its own keys (gathered, no repeated heads, no block-diagonal waste) when the
        step is decode tokens only and nothing is inspected; else the packed batch under its mask."""
        if invariant.row_by_row_active():
            return self._attend_rows
        if step.decode_rows and step.probe is None:
            return DecodeRows(step, self.head_dim).attend
        return None  # the packed path: the layer reads back the step's keys itself

    def _layer(self, layer, h, cos, sin, k_cache, v_cache, step: PagedStep, attend) -> torch.Tensor:
        """One decoder layer on h [1, T, D] → [1, T, D]; writes the step's K and V into this layer's pages."""
        attn, mlp = layer.self_attn, layer.mlp
        x = rms_norm(layer.input_layernorm, h)
        qk, v = self._project_qkv(attn, x)  # [1, T, heads + kv_heads, d], [1, kv_heads, T, d]
        qk = rotate(qk.transpose(1, 2), cos, sin)  # q's heads and k's rotated together: [1, heads + kv_heads, T, d]
        q, k = qk[:, : self.heads], qk[:, self.heads :]  # [1, heads, T, d], [1, kv_heads, T, d]
        if attend is not None and attend != self._attend_rows:  # decode rows: write, then gather per row
            self._write(k, v, k_cache, v_cache, step)
            out = attend(q, k_cache, v_cache, self._attend)
        else:
            keys, values = self._cache(k, v, k_cache, v_cache, step)  # [1, kv_heads, K, d]
            if step.probe is not None:
                step.probe.capture(q, keys, step.mask, self.scaling)
            if attend is None:
                out = self._attend(q, keys, values, step.mask)  # [1, T, heads, d]
            else:
                out = attend(q, keys, values, step)
        h = h + attn.o_proj.forward(out.reshape(*h.shape[:-1], -1).contiguous())
        x = rms_norm(layer.post_attention_layernorm, h)
        gate, up = self._project(mlp, ("gate_proj", "up_proj"), x)
        return h + mlp.down_proj.forward(nn.functional.silu(gate) * up)

    def _project_qkv(self, attn, x) -> tuple[torch.Tensor, torch.Tensor]:
        """x [1, T, D] → q's and k's heads side by side [1, T, heads + kv_heads, d] (Qwen3: each head normalized
        first) and v [1, kv_heads, T, d]. Joined int4 projections come as one tensor already; else q, k are joined."""
        tokens = x.shape[1]
        q, k, v = self._project(attn, ("q_proj", "k_proj", "v_proj"), x)
        q, k, v = (t.view(1, tokens, -1, self.head_dim) for t in (q, k, v))
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        if q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr() and k.stride() == q.stride():
            qk = q.as_strided(
                (1, tokens, self.heads + self.kv_heads, self.head_dim), q.stride()
            )  # already side by side
        else:
            qk = torch.cat((q, k), dim=2)
        return qk, v.transpose(1, 2)

    @staticmethod
    def _project(module, names: tuple[str, ...], x: torch.Tensor) -> list[torch.Tensor]:
        """The named linear layers of `module` on x: one int4 call where they are joined siblings
        (loading/quantize.py), else each layer's own forward. → each output, [1, T, its out_features]."""
        layers = [getattr(module, name) for name in names]
        siblings = getattr(layers[0], "siblings", None)
        joined = siblings.joined(x) if siblings is not None and siblings.layers == layers else None
        if joined is None:
            return [layer.forward(x) for layer in layers]
        return list(joined.view(*x.shape[:-1], -1).split(siblings.widths, dim=-1))

    @staticmethod
    def _write(k, v, k_cache, v_cache, step: PagedStep) -> None:
        """The step's k, v [1, kv_heads, T, d] into their pool slots."""
        k_cache.index_copy_(0, step.write, k.squeeze(0).transpose(0, 1))
        v_cache.index_copy_(0, step.write, v.squeeze(0).transpose(0, 1))

    @staticmethod
    def _cache(k, v, k_cache, v_cache, step: PagedStep) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the step's k, v [1, kv_heads, T, d] to their slots; → every row's keys and values as read
        back from the pool, [1, kv_heads, K, d] (the new ones alone when no row has a past)."""
        k, v = (x.squeeze(0).transpose(0, 1) for x in (k, v))  # [T, kv_heads, d]
        k_cache.index_copy_(0, step.write, k)
        v_cache.index_copy_(0, step.write, v)
        if step.read.numel():
            k, v = k_cache.index_select(0, step.read), v_cache.index_select(0, step.read)  # [K, kv_heads, d]
        return k.transpose(0, 1)[None], v.transpose(0, 1)[None]

    def _attend(self, q, keys, values, mask) -> torch.Tensor:
        """sdpa with the grouped heads arranged as transformers' sdpa integration arranges them: without a
        mask, sdpa's own grouped-query mode; one query, query heads packed per key head; more, keys repeated."""
        batch, tokens, grouped = q.shape[0], q.shape[2], {}
        if self.groups > 1 and mask is None:
            grouped["enable_gqa"] = True
        elif self.groups > 1 and tokens == 1:
            q = q.reshape(batch, self.kv_heads, self.groups, self.head_dim)  # [b, kv_heads, groups, d]
        elif self.groups > 1:
            keys, values = repeat_kv(keys, self.groups), repeat_kv(values, self.groups)
        out = nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling, **grouped)
        return out.reshape(batch, -1, tokens, self.head_dim).transpose(1, 2).contiguous()  # [b, T, heads, d]

    def _attend_rows(self, q, keys, values, step: PagedStep) -> torch.Tensor:
        """Batch-invariant attention: each row's queries over its own keys only, at shapes of its own
        (local/invariant.py); a row with no keys (padding) gets zeros."""
        cu_q, cu_k = step.cu_q.tolist(), step.cu_k.tolist()
        outputs = []
        for row in range(len(cu_q) - 1):
            q0, q1, k0, k1 = cu_q[row], cu_q[row + 1], cu_k[row], cu_k[row + 1]
            if q1 == q0:
                continue
            if k1 == k0:
                outputs.append(q.new_zeros(1, q1 - q0, self.heads, self.head_dim))
                continue
            mask = None if q1 - q0 == 1 else step.mask[:, :, q0:q1, k0:k1].contiguous()
            part = (x[:, :, k0:k1].contiguous() for x in (keys, values))
            outputs.append(self._attend(q[:, :, q0:q1].contiguous(), *part, mask))
        return torch.cat(outputs, dim=1)


class DecodeRows:
    """A decode step's rows (one query each) laid side by side: row r's keys are its own L_r cached positions,
    gathered into [R, kv_heads, L, d] (L the longest row's count, the rest padded with the first slot and
    masked), so attention costs R·L instead of the packed batch's R·ΣL and no key head is copied per query
    head. One row alone is transformers' own decode attention (the same shapes and mask)."""

    def __init__(self, step: PagedStep, head_dim: int):
        cu = step.cu_k.long()
        lengths = cu[1:] - cu[:-1]  # [R]
        width = step.max_k
        cols = torch.arange(width, device=cu.device)
        seen = cols[None, :] < lengths[:, None]  # [R, L]
        at = (cu[:-1, None] + cols[None, :]).clamp_(max=max(step.read.numel() - 1, 0))
        self.slots = step.read[at].masked_fill_(~seen, 0).flatten()  # [R·L] pool slots (padding: slot 0)
        zero = torch.zeros((), dtype=step.mask.dtype, device=cu.device)
        self.mask = torch.where(seen, zero, torch.finfo(step.mask.dtype).min)[:, None, None, :]  # [R, 1, 1, L]
        self.rows, self.width, self.head_dim = lengths.numel(), width, head_dim

    def attend(self, q, k_cache, v_cache, attend) -> torch.Tensor:
        """q [1, heads, R, d] (row r's query at index r) → [1, R, heads, d]."""
        rows, width = self.rows, self.width
        keys, values = (
            cache.index_select(0, self.slots).view(rows, width, -1, self.head_dim).transpose(1, 2)
            for cache in (k_cache, v_cache)
        )  # [R, kv_heads, L, d]
        out = attend(q.transpose(0, 2), keys, values, self.mask)  # [R, 1, heads, d]
        return out.transpose(0, 1)  # [1, R, heads, d]
