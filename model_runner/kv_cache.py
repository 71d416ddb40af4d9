"""The request's KV cache, on transformers' public Cache API only, and its accounting:
measured bytes (the key/value tensors' nbytes summed over layers) beside the formula's bytes."""
from __future__ import annotations

from transformers import DynamicCache

from .kv_math import kv_cache_bytes


class KVCache:
    def __init__(self, model_config, facts):
        self.cache = DynamicCache(config=model_config)
        self.facts = facts

    @property
    def tokens(self) -> int:
        return self.cache.get_seq_length()

    def measured_bytes(self) -> int:
        total = 0
        for layer in self.cache.layers:
            keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
            if keys is not None and keys.numel():
                total += keys.nbytes + values.nbytes
        return total

    def formula_bytes(self, tokens: int | None = None) -> int:
        f = self.facts
        return kv_cache_bytes(f.layers, f.kv_heads, f.head_dim, f.bytes_per_element,
                              self.tokens if tokens is None else tokens)

    def crop(self, length: int) -> None:
        self.cache.crop(length)
