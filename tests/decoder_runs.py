"""Stepping one decoder's batched forward over a pool of its own, the way the engine steps it, so two decoders
(or two companies) can be given the same rows and their logits and K/V rows compared (tests of
model_runner/local/model/native.py, on the fake model and on the real one), and the small random models they
step: `tiny` of each family, `int4_llama` on the int4 route; and `step_shape`, a step's shape alone."""

from __future__ import annotations

import torch
from kvscope_testkit import ask
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from model_runner.loading.quantize import quantize_int4
from model_runner.local.kv_cache import PagedKVPool
from model_runner.local.model.decoders import decoder_for
from model_runner.local.model.paged_step import PagedStep
from model_runner.local.scheduler import Work
from model_runner.local.step.forward import BatchForward
from model_runner.shared.sequence import Sequence

BLOCK = 16


class Run:
    """One decoder's forward over a pool of its own, stepped the way the engine steps it."""

    def __init__(self, model, decoder: str, cuda_graphs: str = "off", invariant_rows: int = 0, blocks: int = 32):
        self.pool = PagedKVPool(model, None, num_blocks=blocks, block_size=BLOCK, max_batch_tokens=1024)
        self.forward = BatchForward(
            model, self.pool, decoder_for(model, self.pool, decoder), cuda_graphs, invariant_rows
        )
        self.seqs: dict[str, Sequence] = {}

    def step(self, rows: list[tuple[str, list[int]]], inspect: set[str] = frozenset()) -> torch.Tensor:
        """rows: (request, its new tokens); a new request's first tokens are its prompt."""
        work = []
        for key, tokens in rows:
            seq = self.seqs.get(key)
            if seq is None:
                seq = self.seqs[key] = Sequence(
                    id=key, params=ask("hi", inspect={"attention": key in inspect}), key=key, prompt_ids=list(tokens)
                )
            assert self.pool.reserve(seq, len(tokens))
            work.append(Work(seq, list(tokens), "decode" if seq.cached else "prefill", wants_logits=True))
        with torch.inference_mode():
            return self.forward(work)

    def kv(self, key: str) -> torch.Tensor:
        """Every layer's K and V rows the request holds, [layers·2, positions, kv_heads, d]."""
        seq = self.seqs[key]
        read: list[list[int]] = [[]]
        self.pool.cache.extend_read_and_write_indices(key, seq.cached, 0, read, [[]])
        slots = torch.tensor(read[0])
        views = self.pool.cache.cache_allocators[
            "full_attention"
        ]._kv_token_views  # layer → (K, V) [slots, kv_heads, d]
        pairs = views.values() if isinstance(views, dict) else views
        return torch.stack([view.index_select(0, slots) for pair in pairs for view in pair])


def tiny(kind: str, **config):
    """A random two-layer model of a family the native step knows (or, for gpt2, one it does not), with every
    bias and norm weight drawn at random (transformers starts biases at 0 and norms at 1, which would hide a
    bias or a norm left out)."""
    torch.manual_seed(1)
    if kind == "gpt2":
        return GPT2LMHeadModel(GPT2Config(vocab_size=300, n_embd=32, n_layer=2, n_head=4)).eval()
    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
               "qwen3": (Qwen3Config, Qwen3ForCausalLM)}  # fmt: skip
    shape = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=512)  # fmt: skip
    make_config, make_model = classes[kind]
    model = make_model(make_config(**{**shape, **config})).eval()
    with torch.no_grad():
        for name, tensor in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                tensor.normal_(1.0 if "norm" in name else 0.0, 0.5)
    return model


def int4_llama(kv_heads: int = 2):
    """A random two-layer Llama on the int4 route, shaped so q, k, v and gate, up join (whole packed blocks)."""
    model = tiny("llama", hidden_size=128, intermediate_size=256, num_attention_heads=4,
                 num_key_value_heads=kv_heads, head_dim=64)  # fmt: skip
    quantize_int4(model)
    return model


def step_shape(rows: list[tuple[int, int]], device: str = "cpu", **flags) -> PagedStep:
    """A PagedStep of rows of (new tokens, keys): its shape alone, for what decides by shape (such as
    paged_step.rows_apart_pay): cu_q and cu_k as the batched forward builds them, its other tensors empty
    (`ids` on `device`, where the rule reads it); `flags`: probe, decode_rows, row_by_row."""
    cu_q, cu_k = [0], [0]
    for new, keys in rows:
        cu_q.append(cu_q[-1] + new)
        cu_k.append(cu_k[-1] + keys)
    none = torch.empty(0, dtype=torch.long)
    return PagedStep(ids=torch.empty(0, dtype=torch.long, device=device), positions=none, mask=None,
                     cu_q=torch.tensor(cu_q, dtype=torch.int32), cu_k=torch.tensor(cu_k, dtype=torch.int32),
                     max_q=max(n for n, _ in rows), max_k=max(k for _, k in rows), write=none, read=none, keep=0,
                     **flags)  # fmt: skip
