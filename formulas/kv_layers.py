"""KV-cache bytes for a model described as layer groups: the exact arithmetic the calculator shows.

A model is a list of groups (kind, layer count, parameters): full attention (MHA/GQA/MQA), MLA (one latent +
RoPE vector per layer, no factor 2), sliding window (at most W positions during a step: transformers stores the
last W − 1 and appends the new one), chunked local (at most C), a fixed per-sequence state (linear attention /
state space: conv + recurrent elements, the conv state in transformers' or vLLM's columns), and shared layers
(reuse another layer's KV, allocate nothing). Storage (element bits, scales per tensor / head / group of G, with
or without zero points), paged block rounding and tensor parallelism apply per group; vllm_capacity reproduces
the capacity line vLLM logs at start. static/js/calculator/kv-layers.js is the twin; both are checked against
static/data/kv_golden.json `layer_cases`. Rules and sources: docs/calculator.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from formulas.kv_math import kv_cache_bytes

# Bits per stored element; fp8's two formats and int8 take the same room, the label says which is meant.
ELEMENT_BITS = {"fp32": 32, "fp16": 16, "fp8": 8, "fp8_e5m2": 8, "int8": 8, "int4": 4}
KINDS = ("full", "sliding", "chunked", "mla", "state", "shared", "cross")
ATTENTION = ("full", "sliding", "chunked", "cross")  # kinds that keep a key and a value per KV head per position
SCALES = ("none", "tensor", "head", "group")
CONV_COLUMNS = ("transformers", "vllm")  # the conv state keeps conv_kernel columns (transformers) or one fewer (vLLM)
# The --kv-cache-dtype values whose pages this file models: auto (the model's fp32 / bf16 / fp16), fp8 (e4m3) and
# fp8_e5m2. vLLM 0.32.0 has more (vllm/config/cache.py CacheDType: fp8_inc, fp8_ds_mla, nvfp4, int8_per_token_head…).
VLLM_KV_TYPES = ("fp32", "fp16", "fp8", "fp8_e5m2")
VLLM_KV_TYPES_TEXT = (
    "reproduced for vLLM's fp32, bf16 / fp16 (--kv-cache-dtype auto), fp8 and fp8_e5m2 caches; vLLM 0.32.0 has others"
    " (fp8_inc, nvfp4, int8_per_token_head, among more) whose pages this calculator does not model"
)
MAX_EXACT = 2**53 - 1  # beyond this a double (the JS twin) cannot hold a whole byte count


class KvInputError(ValueError):
    """Bad model or storage input; `field` names the input, the message states the limit."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Storage:
    kv_dtype: str = "fp16"
    scale: str = "none"  # one scale per tensor (per layer), per KV head per token, or per group of G elements
    group_size: int = 32
    scale_bytes: int = 2
    block_size: int = 1  # paged positions per block; 1 = no rounding
    tp: int = 1
    state_bytes: int = 2  # element size of the per-sequence state (conv + recurrent)
    zero_point: bool = False  # asymmetric quantisation: one zero point beside each scale, the same size
    conv_columns: str = "transformers"
    images: int = 1  # images per request: a cross-attention group holds each image's positions

    @classmethod
    def of(cls, d: dict) -> Storage:
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def _whole(d: dict, key: str, lo: int, hi: int, field: str) -> int:
    v = d.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise KvInputError(field, f"must be a whole number from {lo:,} to {hi:,} (got {v!r})")
    return v


def check_storage(s: Storage) -> None:
    if s.kv_dtype not in ELEMENT_BITS:
        raise KvInputError("kv_dtype", f"unknown element type {s.kv_dtype!r}")
    if s.scale not in SCALES:
        raise KvInputError("scale", f"must be one of {', '.join(SCALES)}")
    for key, lo, hi in (("group_size", 1, 65536), ("scale_bytes", 1, 8), ("block_size", 1, 4096), ("tp", 1, 1024)):
        _whole(s.__dict__, key, lo, hi, key)
    _whole(s.__dict__, "state_bytes", 1, 8, "state_bytes")
    _whole(s.__dict__, "images", 0, 1024, "images")
    if not isinstance(s.zero_point, bool):
        raise KvInputError("zero_point", "must be true or false")
    if s.conv_columns not in CONV_COLUMNS:
        raise KvInputError("conv_columns", f"must be one of {', '.join(CONV_COLUMNS)}")


def check_group(g: dict, i: int) -> None:
    where = f"groups[{i}]"
    if g.get("kind") not in KINDS:
        raise KvInputError(f"{where}.kind", f"unknown kind {g.get('kind')!r}; known: {', '.join(KINDS)}")
    _whole(g, "layers", 1, 4096, f"{where}.layers")
    kind = g["kind"]
    if kind in ATTENTION:
        _whole(g, "kv_heads", 1, 4096, f"{where}.kv_heads")
        _whole(g, "head_dim", 1, 65536, f"{where}.head_dim")
        if "value_dim" in g:
            _whole(g, "value_dim", 1, 65536, f"{where}.value_dim")
    if kind == "sliding":
        _whole(g, "window", 1, 2**30, f"{where}.window")
    if kind == "chunked":
        _whole(g, "chunk", 1, 2**30, f"{where}.chunk")
    if kind == "cross":
        _whole(g, "per_image", 1, 2**30, f"{where}.per_image")
    if kind == "mla":
        _whole(g, "latent", 1, 65536, f"{where}.latent")
        _whole(g, "rope_dim", 0, 65536, f"{where}.rope_dim")
    if kind == "state":
        _whole(g, "conv", 0, 2**40, f"{where}.conv")
        _whole(g, "state", 0, 2**40, f"{where}.state")
        if "conv_kernel" in g:
            _whole(g, "conv_kernel", 1, 1024, f"{where}.conv_kernel")
        if "recurrent_bytes" in g:
            _whole(g, "recurrent_bytes", 1, 8, f"{where}.recurrent_bytes")


def kv_heads_per_gpu(kv_heads: int, tp: int) -> int:
    """max(1, heads / TP): heads split over the GPUs, replicated once TP exceeds them."""
    if (tp <= kv_heads and kv_heads % tp) or (tp > kv_heads and tp % kv_heads):
        raise KvInputError("tp", f"{tp} GPUs cannot split {kv_heads} KV heads evenly (nor replicate them evenly)")
    return max(1, kv_heads // tp)


def check_attention_heads(heads: int | None, tp: int) -> None:
    """vLLM refuses a TP that does not divide the attention heads (vllm/config/model.py
    ModelConfig.verify_with_parallel_config: "Total number of attention heads (71) must be divisible by tensor
    parallel size (2)."), whatever the KV heads; `heads` None (not given) is not checked."""
    if heads is not None and heads % tp:
        raise KvInputError(
            "tp", f"{tp} GPUs cannot split {heads} attention heads (num_attention_heads) evenly, which vLLM requires"
        )


def _vector_bytes(elements: int, bits: int) -> int:
    return math.ceil(elements * bits / 8)  # int4 packs two elements a byte; an odd count still takes its byte


def _scale_bytes_per_token(vectors: int, width: int, s: Storage) -> int:
    """Scale bytes one position adds to one layer: `vectors` vectors of `width` elements (K and V heads, or MLA's
    one); a zero point beside each scale doubles them."""
    each = s.scale_bytes * (2 if s.zero_point else 1)
    if s.scale == "head":
        return vectors * each
    if s.scale == "group":
        return vectors * math.ceil(width / s.group_size) * each
    return 0


def layer_token_bytes(g: dict, s: Storage) -> int:
    """Bytes one cached position takes in one layer of group `g`, on one GPU."""
    bits = ELEMENT_BITS[s.kv_dtype]
    if g["kind"] == "mla":
        width = g["latent"] + g["rope_dim"]  # one shared vector: latent c_KV plus the decoupled RoPE key
        return _vector_bytes(width, bits) + _scale_bytes_per_token(1, width, s)
    if g["kind"] in ATTENTION:
        heads = kv_heads_per_gpu(g["kv_heads"], s.tp)
        key, value = g["head_dim"], g.get("value_dim", g["head_dim"])  # a value narrower than the key: llama.cpp
        return sum(_vector_bytes(heads * w, bits) + _scale_bytes_per_token(heads, w, s) for w in (key, value))
    return 0


def positions_held(g: dict, tokens: int, images: int = 1) -> int:
    """Positions a group holds while the T-th is computed: a window keeps W (transformers stores W − 1 between
    steps and appends the new one; vLLM frees whole blocks, so it may hold up to one block more); a
    cross-attention group holds its images' positions, however long the text."""
    kind = g["kind"]
    if kind == "cross":
        return images * g["per_image"]
    if kind == "sliding":
        return min(tokens, g["window"])
    if kind == "chunked":
        return min(tokens, g["chunk"])  # the peak: a whole chunk just before the next one starts
    if kind in ("full", "mla"):
        return tokens
    return 0


def _fixed_scale_bytes(g: dict, s: Storage) -> int:
    """Per-tensor scales: one per K and per V tensor of each layer (MLA: one), per GPU, whatever the traffic."""
    if s.scale != "tensor" or g["kind"] not in (*ATTENTION, "mla"):
        return 0
    return g["layers"] * (1 if g["kind"] == "mla" else 2) * s.scale_bytes * (2 if s.zero_point else 1)


def state_layer_bytes(g: dict, s: Storage) -> int:
    """One state layer's bytes per sequence on one GPU: conv + recurrent elements, vLLM's conv state keeping
    conv_kernel − 1 columns; a group's own recurrent_bytes (RecurrentGemma's float32 RG-LRU state) overrides the
    state type for the recurrent part."""
    conv = g["conv"]
    if s.conv_columns == "vllm" and g.get("conv_kernel"):
        conv = conv // g["conv_kernel"] * (g["conv_kernel"] - 1)
    if "recurrent_bytes" in g:
        return math.ceil(conv / s.tp) * s.state_bytes + math.ceil(g["state"] / s.tp) * g["recurrent_bytes"]
    return math.ceil((conv + g["state"]) / s.tp) * s.state_bytes


def group_bytes(g: dict, tokens: int, s: Storage) -> dict:
    """One group's share for one sequence of `tokens` positions, on one GPU."""
    held = positions_held(g, tokens, s.images)
    allocated = math.ceil(held / s.block_size) * s.block_size
    per_layer_token = layer_token_bytes(g, s)
    state = 0
    if g["kind"] == "state":
        state = g["layers"] * state_layer_bytes(g, s)
    return {
        "kind": g["kind"],
        "layers": g["layers"],
        "layer_token_bytes": per_layer_token,
        "positions_held": held,
        "positions_allocated": allocated,
        "sequence_bytes": g["layers"] * allocated * per_layer_token + state,
        "fixed_bytes": _fixed_scale_bytes(g, s),
    }


def cache_bytes(groups: list[dict], tokens: int, sequences: int, storage: Storage | dict) -> dict:
    """Exact cache bytes for `sequences` sequences of `tokens` positions: per GPU and over all TP GPUs."""
    s = storage if isinstance(storage, Storage) else Storage.of(storage)
    check_storage(s)
    if not groups:
        raise KvInputError("groups", "a model needs at least one layer group")
    for i, g in enumerate(groups):
        check_group(g, i)
    _whole({"t": tokens}, "t", 0, 2**30, "tokens")
    _whole({"n": sequences}, "n", 1, 2**20, "sequences")
    parts = [group_bytes(g, tokens, s) for g in groups]
    seq_gpu = sum(p["sequence_bytes"] for p in parts)
    fixed_gpu = sum(p["fixed_bytes"] for p in parts)
    total_gpu = seq_gpu * sequences + fixed_gpu
    if total_gpu * s.tp > MAX_EXACT:
        raise KvInputError(
            "tokens", "the total passes 2^53 bytes (8 PiB), beyond exact arithmetic here: fewer tokens or sequences"
        )
    grows = [p for p in parts if p["kind"] != "cross"]
    return {
        "groups": parts,
        "per_token_bytes": sum(p["layers"] * p["layer_token_bytes"] for p in grows) * s.tp,
        "per_image_bytes": sum(
            g["layers"] * g["per_image"] * layer_token_bytes(g, s) for g in groups if g["kind"] == "cross"
        )
        * s.tp,
        "sequence_bytes": seq_gpu * s.tp,
        "per_gpu_sequence_bytes": seq_gpu,
        "fixed_bytes": fixed_gpu * s.tp,
        "per_gpu_fixed_bytes": fixed_gpu,
        "per_gpu_total_bytes": total_gpu,
        "total_bytes": total_gpu * s.tp,
    }


def naive_bytes(naive: dict, tokens: int, sequences: int, kv_dtype: str) -> int:
    """The one formula, 2 × layers × KV heads × head dim × bytes × T × N, on the config's top-level numbers; for
    MLA the uncompressed cache it replaces: layers × heads × (key dim + value dim) × bytes × T × N."""
    if "key_dim" in naive:
        per_token = naive["layers"] * naive["kv_heads"] * (naive["key_dim"] + naive["value_dim"])
        return math.ceil(per_token * ELEMENT_BITS[kv_dtype] / 8) * tokens * sequences
    return kv_cache_bytes(
        naive["layers"], naive["kv_heads"], naive["head_dim"], ELEMENT_BITS[kv_dtype] / 8, tokens, sequences
    )


def further_token_bytes(groups: list[dict], tokens: int, storage: Storage | dict) -> int:
    """Bytes one more position adds to one sequence past `tokens`, over all GPUs (before block rounding): the
    layers still growing there; a window or chunk already full adds nothing."""
    s = storage if isinstance(storage, Storage) else Storage.of(storage)
    grows = [g for g in groups if positions_held(g, tokens + 1) > positions_held(g, tokens)]
    return sum(g["layers"] * layer_token_bytes(g, s) for g in grows) * s.tp


def python_2f(value: float) -> str:
    """How vLLM prints the concurrency ("%.2fx"): Python's rounding, half to even on the double."""
    return "%.2f" % value


def vllm_capacity(groups: list[dict], storage: Storage | dict, space_bytes: int, max_model_len: int) -> dict:
    """The line vLLM logs at start, "KV cache size: N tokens, Maximum concurrency for L tokens per request: C x",
    for a model whose every layer is full attention or every layer MLA (vllm/v1/core/kv_cache_utils.py:
    num_blocks = space // page_size // layers, page_size = block_size × one position's bytes in one layer;
    concurrency = num_blocks / cdiv(L, block_size); tokens = int(concurrency × L)), on one GPU's KV space."""
    s = storage if isinstance(storage, Storage) else Storage.of(storage)
    check_storage(s)
    if len(groups) != 1 or groups[0]["kind"] not in ("full", "mla"):
        raise KvInputError("groups", "reproduced only for models whose every layer is full attention (or MLA)")
    # Any positive --block-size: vLLM 0.32.0's CacheConfig.block_size is Field(gt=0); the attention backend may
    # refuse a size (get_supported_kernel_block_sizes), which is the backend's rule, not the capacity line's.
    if s.kv_dtype not in VLLM_KV_TYPES:
        raise KvInputError("kv_dtype", VLLM_KV_TYPES_TEXT)
    if s.scale not in ("none", "tensor"):
        raise KvInputError("scale", "vLLM's fp8 cache keeps its scales per tensor (k_scale, v_scale per layer)")
    g = groups[0]
    check_group(g, 0)
    _whole({"v": space_bytes}, "v", 1, MAX_EXACT, "space_bytes")
    _whole({"v": max_model_len}, "v", 1, 2**30, "max_model_len")
    page = s.block_size * layer_token_bytes(g, s)
    blocks = space_bytes // page // g["layers"]
    per_request = math.ceil(max_model_len / s.block_size)
    concurrency = blocks / per_request
    return {
        "page_bytes": page,
        "blocks": blocks,
        "blocks_per_request": per_request,
        "tokens": int(concurrency * max_model_len),
        "concurrency": concurrency,
        "concurrency_text": python_2f(concurrency),
    }


def fit(
    groups: list[dict], storage: Storage | dict, memory: int, weights: int, tokens: int, sequences: int, max_tokens: int
) -> dict:
    """Memory plan on one GPU: weights ÷ TP + fixed scales + N sequences. How many sequences of `tokens`
    fit, and the longest T (up to `max_tokens`) for `sequences` sequences; None where even one does not fit."""
    s = storage if isinstance(storage, Storage) else Storage.of(storage)
    weights_gpu = math.ceil(weights / s.tp)
    free = memory - weights_gpu - cache_bytes(groups, 0, 1, s)["per_gpu_fixed_bytes"]

    def per_seq(t: int) -> int:
        return cache_bytes(groups, t, 1, s)["per_gpu_sequence_bytes"]

    one = per_seq(tokens)
    fit_sequences = max(0, free // one) if one else None  # None: nothing grows, any number fits
    lo, hi = 0, max_tokens  # per_seq is non-decreasing in t: bisect for the largest t that fits
    if free < 0 or sequences * per_seq(0) > free:
        return {"weights_per_gpu": weights_gpu, "sequences": 0, "tokens": 0}
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sequences * per_seq(mid) <= free:
            lo = mid
        else:
            hi = mid - 1
    return {"weights_per_gpu": weights_gpu, "sequences": fit_sequences, "tokens": lo}
