"""The engine core: one step = schedule (scheduler) → one batched forward over the paged KV pool
(forward, kv_cache) → postprocess; requests (sequence, stream) and the engine feed."""
