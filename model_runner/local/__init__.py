"""The local engine, on a model loaded in this process: the engine loop on top (engine, scheduler, kv_cache,
postprocess); one step's model work in step/ (the batched forward, the static step and its graphs,
batch-invariant steps); the model code it runs in model/ (the PagedStep contract, the two decoders)."""
