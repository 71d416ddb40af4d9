"""A tiny deterministic stand-in for tests: a real 2-layer Llama (so the KV cache and its
accounting are real) whose logits are steered to spell a fixed answer over a byte tokenizer.
Not a language model: fast unit tests only ("--model fake")."""

from __future__ import annotations

import time

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from model_runner.text.tokenizer import ByteTokenizer

ANSWER = "Hello from the fake model. The cache grows by one column per token \U0001f600 and then it stops."
STEER = 6.0  # logit boost for the scripted byte: greedy follows the script, sampling sometimes strays


class ScriptedLM(nn.Module):
    """Runs the tiny Llama; the engine then steers each row's logits towards ANSWER's next byte.

    The position in the answer is counted from the last `<|im_start|>assistant\n` header in the
    row's token history, so batched, paged, recomputed and cache-free runs give the same text."""

    def __init__(self, base: LlamaForCausalLM, delay_s: float = 0.0):
        super().__init__()
        self.base = base
        self.config = base.config
        self.delay_s = delay_s
        if delay_s:  # a bigger model's step time, on whatever runs the layers (native step, forward, recompute)
            base.model.embed_tokens.register_forward_pre_hook(self._stand_in_step_time)
        self.script = list(ANSWER.encode()) + [ByteTokenizer.IM_END]
        self.header = [ByteTokenizer.IM_START, *b"assistant\n"]

    @property
    def device(self) -> torch.device:
        return self.base.device

    @property
    def dtype(self) -> torch.dtype:
        return self.base.dtype

    def set_attn_implementation(self, name: str) -> None:
        self.base.set_attn_implementation(name)

    def _stand_in_step_time(self, *_) -> None:
        time.sleep(self.delay_s)

    def forward(self, input_ids: torch.Tensor, **kwargs):
        return self.base(input_ids=input_ids, **kwargs)  # input_ids: [1, tokens]

    def steer_logits(self, histories: list[list[int]], logits: torch.Tensor) -> torch.Tensor:
        """logits: [rows, vocab], row i after the tokens histories[i] → the same, steered."""
        bias = torch.zeros_like(logits)
        for row, seen in enumerate(histories):
            bias[row, self._next_scripted(seen)] = STEER
        return logits + bias

    def _next_scripted(self, seen: list[int]) -> int:
        n = len(self.header)
        starts = [i + n for i in range(len(seen) - n, -1, -1) if seen[i : i + n] == self.header]
        generated = len(seen) - starts[0] if starts else 0
        return self.script[min(generated, len(self.script) - 1)]

    def num_parameters(self) -> int:
        return self.base.num_parameters()

    def parameters(self, recurse: bool = True):
        return self.base.parameters(recurse)


def build_fake(delay_s: float = 0.0) -> tuple[ScriptedLM, ByteTokenizer]:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=ByteTokenizer.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=512,
        bos_token_id=ByteTokenizer.IM_START,
        eos_token_id=ByteTokenizer.IM_END,
        tie_word_embeddings=True,
    )
    base = LlamaForCausalLM(config).eval()
    return ScriptedLM(base, delay_s).eval(), ByteTokenizer()
