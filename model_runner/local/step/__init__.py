"""One engine step's model work: the batched forward over the paged pool (and the failed batch retried
request by request), the static decode step and its CUDA graphs, batch-invariant steps, prompt logprobs."""
