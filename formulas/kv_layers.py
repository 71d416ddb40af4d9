"""KV-cache bytes for a model described as layer groups: the exact arithmetic the calculator shows.

A model is a list of groups (kind, layer count, parameters): full attention (MHA/GQA/MQA), MLA (one latent +
RoPE vector per layer, no factor 2), sliding window (holds min(T, W) positions), chunked local (at most C), a
fixed per-sequence state (linear attention / state space: conv + recurrent elements), and shared layers (reuse
another layer's KV, allocate nothing). Storage (element bits, scales per tensor / head / group of G), paged
block rounding and tensor parallelism apply per group. static/js/calculator/kv-layers.js is the twin; both are
checked against static/data/kv_golden.json `layer_cases`. Rules and sources: docs/calculator.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from formulas.kv_math import kv_cache_bytes

# Bits per stored element; fp8's two formats and int8 take the same room, the label says which is meant.
ELEMENT_BITS = {"fp32": 32, "fp16": 16, "fp8": 8, "fp8_e5m2": 8, "int8": 8, "int4": 4}
KINDS = ("full", "sliding", "chunked", "mla", "state", "shared")
SCALES = ("none", "tensor", "head", "group")
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


def check_group(g: dict, i: int) -> None:
    where = f"groups[{i}]"
    if g.get("kind") not in KINDS:
        raise KvInputError(f"{where}.kind", f"unknown kind {g.get('kind')!r}; known: {', '.join(KINDS)}")
    _whole(g, "layers", 1, 4096, f"{where}.layers")
    kind = g["kind"]
    if kind in ("full", "sliding", "chunked"):
        _whole(g, "kv_heads", 1, 4096, f"{where}.kv_heads")
        _whole(g, "head_dim", 1, 65536, f"{where}.head_dim")
    if kind == "sliding":
        _whole(g, "window", 1, 2**30, f"{where}.window")
    if kind == "chunked":
        _whole(g, "chunk", 1, 2**30, f"{where}.chunk")
    if kind == "mla":
        _whole(g, "latent", 1, 65536, f"{where}.latent")
        _whole(g, "rope_dim", 0, 65536, f"{where}.rope_dim")
    if kind == "state":
        _whole(g, "conv", 0, 2**40, f"{where}.conv")
        _whole(g, "state", 0, 2**40, f"{where}.state")


def kv_heads_per_gpu(kv_heads: int, tp: int) -> int:
    """max(1, heads / TP): heads split over the GPUs, replicated once TP exceeds them."""
    if (tp <= kv_heads and kv_heads % tp) or (tp > kv_heads and tp % kv_heads):
        raise KvInputError("tp", f"{tp} GPUs cannot split {kv_heads} KV heads evenly (nor replicate them evenly)")
    return max(1, kv_heads // tp)


def _vector_bytes(elements: int, bits: int) -> int:
    return math.ceil(elements * bits / 8)  # int4 packs two elements a byte; an odd count still takes its byte


def _scale_bytes_per_token(vectors: int, width: int, s: Storage) -> int:
    """Scale bytes one position adds to one layer: `vectors` vectors of `width` elements (K and V heads, or MLA's one)."""
    if s.scale == "head":
        return vectors * s.scale_bytes
    if s.scale == "group":
        return vectors * math.ceil(width / s.group_size) * s.scale_bytes
    return 0


def layer_token_bytes(g: dict, s: Storage) -> int:
    """Bytes one cached position takes in one layer of group `g`, on one GPU."""
    bits = ELEMENT_BITS[s.kv_dtype]
    if g["kind"] == "mla":
        width = g["latent"] + g["rope_dim"]  # one shared vector: latent c_KV plus the decoupled RoPE key
        return _vector_bytes(width, bits) + _scale_bytes_per_token(1, width, s)
    if g["kind"] in ("full", "sliding", "chunked"):
        heads = kv_heads_per_gpu(g["kv_heads"], s.tp)
        return 2 * _vector_bytes(heads * g["head_dim"], bits) + _scale_bytes_per_token(2 * heads, g["head_dim"], s)
    return 0


def positions_held(g: dict, tokens: int) -> int:
    kind = g["kind"]
    if kind == "sliding":
        return min(tokens, g["window"])
    if kind == "chunked":
        return min(tokens, g["chunk"])  # the peak: a whole chunk just before the next one starts
    if kind in ("full", "mla"):
        return tokens
    return 0


def _fixed_scale_bytes(g: dict, s: Storage) -> int:
    """Per-tensor scales: one per K and per V tensor of each layer (MLA: one), per GPU, whatever the traffic."""
    if s.scale != "tensor" or g["kind"] not in ("full", "sliding", "chunked", "mla"):
        return 0
    return g["layers"] * (1 if g["kind"] == "mla" else 2) * s.scale_bytes


def group_bytes(g: dict, tokens: int, s: Storage) -> dict:
    """One group's share for one sequence of `tokens` positions, on one GPU."""
    held = positions_held(g, tokens)
    allocated = math.ceil(held / s.block_size) * s.block_size
    per_layer_token = layer_token_bytes(g, s)
    state = 0
    if g["kind"] == "state":
        state = g["layers"] * math.ceil((g["conv"] + g["state"]) / s.tp) * s.state_bytes
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
    return {
        "groups": parts,
        "per_token_bytes": sum(p["layers"] * p["layer_token_bytes"] for p in parts) * s.tp,
        "sequence_bytes": seq_gpu * s.tp,
        "per_gpu_sequence_bytes": seq_gpu,
        "fixed_bytes": fixed_gpu * s.tp,
        "per_gpu_fixed_bytes": fixed_gpu,
        "per_gpu_total_bytes": total_gpu,
        "total_bytes": total_gpu * s.tp,
    }


def naive_bytes(naive: dict, tokens: int, sequences: int, kv_dtype: str) -> int:
    """The one formula, 2 × layers × KV heads × head dim × bytes × T × N, on the config's top-level numbers."""
    return kv_cache_bytes(
        naive["layers"], naive["kv_heads"], naive["head_dim"], ELEMENT_BITS[kv_dtype] / 8, tokens, sequences
    )


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
