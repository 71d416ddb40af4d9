"""The engine's two decoders of a PagedStep and the choice between them (`--decoder`): the native step for the
Llama family (local/model/native.py), and transformers' own forward through its paged attention for every other
architecture. `auto` takes the native step wherever it runs transformers' ops for the model (the same bits at the
same shapes, within rounding where it attends rows apart)."""

from __future__ import annotations

import torch

from model_runner.local.config import DECODERS
from model_runner.local.kv_cache import FULL
from model_runner.local.model.attention_inspect import IMPLEMENTATION, PROBE_KWARG, ROWS_KWARG, register
from model_runner.local.model.native import NativeLlama, native_support
from model_runner.local.model.paged_step import Decoder, PagedStep
from model_runner.protocol.errors import UserError

# Attentions that take the paged cache: kvscope's sdpa (transformers' sdpa unless a request is
# inspected, local/model/attention_inspect.py) and transformers' paged eager.
PAGED_ATTENTION = (IMPLEMENTATION, "paged|eager")


class TransformersDecoder:
    """transformers' forward of the model over the pool (sdpa with a `cache=` argument: the model writes each
    row's new keys and values into its blocks and reads its past from them)."""

    name = "transformers"

    def __init__(self, model, pool):
        if model.config._attn_implementation not in PAGED_ATTENTION:
            model.set_attn_implementation(register())
        self.model, self.cache = model, pool.cache

    def run(self, step: PagedStep) -> torch.Tensor:
        if step.row_by_row and not self.inspects():  # only kvscope's sdpa attends row by row
            self.model.set_attn_implementation(register())
        out = self.model(
            input_ids=step.ids[None],
            position_ids=step.positions[None],
            attention_mask=step.mask,
            cache=self.cache,
            cu_seq_lens_q=step.cu_q,
            cu_seq_lens_k={FULL: step.cu_k},
            max_length_q=step.max_q,
            max_length_k={FULL: step.max_k},
            write_index=[step.write],
            read_index=[step.read],
            block_table=None,
            use_cache=False,
            is_causal=False,
            logits_to_keep=step.keep,  # hidden states sliced before the LM head
            **({PROBE_KWARG: step.probe} if step.probe is not None else {}),
            **({ROWS_KWARG: True} if step.row_by_row else {}),
        )
        return out.logits[0]

    def inspects(self) -> bool:
        """Attention inspection runs inside kvscope's sdpa only (another attention, e.g. paged eager, has no probe)."""
        return self.model.config._attn_implementation == IMPLEMENTATION

    def needs_mask(self, step: PagedStep) -> bool:
        return True  # the model's attention always reads the packed mask


def decoder_for(model, pool, choice: str = "auto") -> Decoder:
    """The decoder `choice` names for `model` over `pool` (auto: native where it runs the model exactly)."""
    if choice not in DECODERS:
        raise UserError(f"--decoder must be one of {', '.join(DECODERS)}, got {choice!r}", field="decoder")
    why = native_support(model)
    if choice == "native" and why is not None:
        raise UserError(f"--decoder native cannot run this model: {why}; use --decoder transformers", field="decoder")
    if choice == "transformers" or why is not None:
        return TransformersDecoder(model, pool)
    return NativeLlama(model, pool)


def decoder_report(decoder: Decoder, model, choice: str) -> dict:
    """What /api/model says about the decoder: which one runs, what was asked, and why."""
    why = native_support(model)
    if decoder.name == "native":
        reason = f"the native step: {model.config.model_type} is a Llama-family architecture"
    elif choice == "transformers":
        reason = "--decoder transformers"
    else:
        reason = f"transformers' forward: the native step does not run this model ({why})"
    return {"name": decoder.name, "asked": choice, "reason": reason}
