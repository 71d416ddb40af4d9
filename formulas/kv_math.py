"""KV-cache arithmetic: the one formula shared by the engine's accounting and the calculator.

bytes = 2 (keys and values) × layers × KV heads × head dim × bytes per element × cached positions × sequences.
Besides the formula: paged-vs-contiguous allocation for a mix of request lengths, weights bytes, and the
reverse solve (how many sequences, or how many positions, fit in a memory size). static/js/calculator/
kv-math.js mirrors these functions; static/data/kv_golden.json holds the cases both must reproduce. Models that
are not one group of full attention (MLA, windows, chunks, states, shared layers, scales, TP): kv_layers.py.
"""

from __future__ import annotations

import math

GIB = 1024**3


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_element: float) -> int:
    return int(2 * layers * kv_heads * head_dim * bytes_per_element)


def kv_cache_bytes(
    layers: int, kv_heads: int, head_dim: int, bytes_per_element: float, tokens: int, sequences: int = 1
) -> int:
    return kv_bytes_per_token(layers, kv_heads, head_dim, bytes_per_element) * tokens * sequences


def paged_tokens(length: int, block_size: int) -> int:
    """Positions a paged cache reserves for one request: whole blocks, the last one partly empty."""
    return math.ceil(length / block_size) * block_size


def allocation(lengths: list[int], block_size: int, max_tokens: int, bytes_per_token: int) -> dict[str, int]:
    """Reserved vs used bytes for requests of `lengths` positions.

    Contiguous: every request reserves `max_tokens` positions up front. Paged: each request holds whole
    blocks of `block_size` positions. Lengths above `max_tokens` are cut to it (a request cannot outgrow
    its reservation).
    """
    lengths = [min(length, max_tokens) for length in lengths]
    used = sum(lengths)
    paged = sum(paged_tokens(length, block_size) for length in lengths)
    contiguous = max_tokens * len(lengths)
    return {
        "used_tokens": used,
        "paged_tokens": paged,
        "contiguous_tokens": contiguous,
        "used_bytes": used * bytes_per_token,
        "paged_bytes": paged * bytes_per_token,
        "contiguous_bytes": contiguous * bytes_per_token,
    }


def weights_bytes(params: int, bytes_per_element: float) -> int:
    """Bytes of `params` weights; half a byte still takes its nibble, so int4 rounds up."""
    return math.ceil(params * bytes_per_element)


def max_sequences(memory_bytes: int, weights: int, bytes_per_token: int, tokens: int) -> int:
    """Whole sequences of `tokens` cached positions that fit beside the weights (0 when none does)."""
    return max(0, (memory_bytes - weights) // (bytes_per_token * tokens))


def max_tokens(memory_bytes: int, weights: int, bytes_per_token: int, sequences: int) -> int:
    """Cached positions per sequence that fit for `sequences` sequences beside the weights."""
    return max(0, (memory_bytes - weights) // (bytes_per_token * sequences))
