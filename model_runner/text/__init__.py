"""Text in and out: the chat template and context budget (prompt), tokenizers, the incremental
detokenizer, stop conditions and the sampler."""
