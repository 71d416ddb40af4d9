"""The contract between the engine's forwards and its decoders: a `PagedStep` (one packed forward over the
paged KV pool: the rows' new tokens, their positions, the slots they write and read, their mask) and the
`Decoder` that runs it — transformers' model call or the native step (local/model/decoders.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class PagedStep:
    """One packed forward of the engine over the pool: T new tokens of R rows, K keys read in all.
    Both decoders (local/model/decoders.py) take it; the batched forward and the static step build it."""

    ids: torch.Tensor  # [T] token ids
    positions: torch.Tensor  # [T] each token's position in its request
    # [1, 1, T, K] additive: 0 where a token sees a key, the dtype's minimum elsewhere; None where the decoder
    # does not read it (Decoder.needs_mask: the native step's decode rows build their own)
    mask: torch.Tensor | None
    cu_q: torch.Tensor  # [R + 1] int32 cumulative new tokens per row
    cu_k: torch.Tensor  # [R + 1] int32 cumulative keys per row (its past and its new tokens)
    max_q: int
    max_k: int
    write: torch.Tensor  # [T] int64 the pool slot each new token's K and V go to
    read: torch.Tensor  # [K] int64 the pool slots read as keys, row by row ([0]: the new tokens only)
    keep: torch.Tensor | int  # [N] int64 the tokens whose logits are wanted, or 0 for all T
    probe: object | None = None  # attention inspection (local/model/attention_inspect.py), or None
    # Every row is one new token after its past and max_k is the longest row's keys (not a padded width):
    # the native step may then attend row by row over gathered keys (local/model/native.py DecodeRows).
    decode_rows: bool = False


class Decoder(Protocol):
    """Runs a PagedStep: writes its new tokens' K and V into the pool and returns the kept tokens' logits."""

    name: str  # "native" or "transformers", as /api/model shows it

    def run(self, step: PagedStep) -> torch.Tensor:  # [kept tokens, vocab]
        ...

    def inspects(self) -> bool:  # whether a step's attention probe (local/model/attention_inspect.py) is filled
        ...

    def needs_mask(self, step: PagedStep) -> bool:  # whether `step` must carry its packed mask
        ...
