"""KV-cache arithmetic: the one formula shared by the engine's accounting and the calculator.

bytes = 2 (keys and values) × layers × KV heads × head dim × bytes per element × cached positions × sequences.
"""
from __future__ import annotations


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, bytes_per_element: float) -> int:
    return int(2 * layers * kv_heads * head_dim * bytes_per_element)


def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, bytes_per_element: float,
                   tokens: int, sequences: int = 1) -> int:
    return kv_bytes_per_token(layers, kv_heads, head_dim, bytes_per_element) * tokens * sequences
