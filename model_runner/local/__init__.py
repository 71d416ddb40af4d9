"""The local engine: one step = schedule (scheduler) → one batched forward over the paged KV pool
(forward, kv_cache) → postprocess, on a model loaded in this process."""
