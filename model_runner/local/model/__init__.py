"""The model code a step runs: the `PagedStep` contract, the two decoders (the native Llama-family step and
transformers' own forward) and kvscope's attention with its inspection."""
