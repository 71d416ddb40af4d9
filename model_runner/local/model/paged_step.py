"""The contract between the engine's forwards and its decoders: a `PagedStep` (one packed forward over the
paged KV pool: the rows' new tokens, their positions, the slots they write and read, their mask, and how its
queries meet their keys) and the `Decoder` that runs it — transformers' model call or the native step
(local/model/decoders.py); and `attend_row_by_row`, batch-invariant attention, which both decoders run and the
native step also runs where it pays (`rows_apart_pay`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

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
    # Batch-invariant mode (local/step/invariant.py): each row's queries over its own keys alone
    # (`attend_row_by_row`), so a row's bits do not depend on the rows beside it.
    row_by_row: bool = False


@dataclass(frozen=True)
class RowBounds:
    """A step's row boundaries read to the host once a step, for attention row by row (`attend_row_by_row`)."""

    cu_q: list[int]
    cu_k: list[int]

    @classmethod
    def of(cls, step: PagedStep) -> RowBounds:
        return cls(step.cu_q.tolist(), step.cu_k.tolist())


class Decoder(Protocol):
    """Runs a PagedStep: writes its new tokens' K and V into the pool and returns the kept tokens' logits."""

    name: str  # "native" or "transformers", as /api/model shows it

    def run(self, step: PagedStep) -> torch.Tensor:  # [kept tokens, vocab]
        ...

    def inspects(self) -> bool:  # whether a step's attention probe (local/model/attention_inspect.py) is filled
        ...

    def needs_mask(self, step: PagedStep) -> bool:  # whether `step` must carry its packed mask
        ...


# attend(q [1, heads, t, d], keys [1, kv_heads, k, d], values, mask [1, 1, t, k] or None) → [1, t, heads, d]
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def attend_row_by_row(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    cu_q: list[int],
    cu_k: list[int],
    attend: Attend,
) -> torch.Tensor:
    """Batch-invariant attention over a packed step: row r's queries (query [1, heads, T, d], at cu_q[r] …)
    against its own keys only (keys and values [1, kv_heads, K, d], at cu_k[r] …), each sliced out and copied
    to a tensor of its own, so a row's softmax and its weighted sum of values are taken over the same numbers
    in the same order whoever shares the step. A row with no keys (the padding of a fixed row count) gets
    zeros. → [1, T, heads, d]."""
    heads, head_dim = query.shape[1], query.shape[-1]
    outputs = []
    for row in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[row], cu_q[row + 1], cu_k[row], cu_k[row + 1]
        if q1 == q0:
            continue
        if k1 == k0:  # padding: sees nothing, and nothing sees it
            outputs.append(query.new_zeros(1, q1 - q0, heads, head_dim))
            continue
        own = None if q1 - q0 == 1 else mask[:, :, q0:q1, k0:k1].contiguous()
        part = (x[:, :, k0:k1].contiguous() for x in (keys, values))
        outputs.append(attend(query[:, :, q0:q1].contiguous(), *part, own))
    return torch.cat(outputs, dim=1)


# The query-key pairs a step must save a row before attending its rows apart pays: the smallest count at which
# apart gained in scripts/prompt_step_probe.py's runs on a 2-core Xeon with the bundled model (9 heads of 64,
# float32 attention): 3 prompts of 64 tokens (8,192 a row) gained, 2 of 64 (4,096) and 4 of 32 (3,072) lost
# (docs/performance.md). Not measured: other CPUs, thread counts, head shapes and dtypes, and a chunk beside
# decode rows.
SAVED_PAIRS_PER_ROW = 8192


def rows_may_go_apart(step: PagedStep) -> bool:
    """Whether a step's rows could be attended apart at all: on the CPU (off it the packed call stays: many
    small calls would cost launches, not measured), two or more rows, and some row bringing two or more tokens
    (steps of one-token rows stay as they are: DecodeRows, the padded static step, one-token prompts)."""
    return step.ids.device.type == "cpu" and step.cu_q.numel() > 2 and step.max_q > 1


def rows_apart_pay(step: PagedStep) -> bool:
    """Whether a CPU step of several rows (prompts, chunks, decodes beside them) attends faster row by row
    (attend_row_by_row): the packed batch scores all T queries against all K keys and masks the other rows'
    away, row r needs only its t_r × k_r, so eight 64-token prompts packed score eight times the pairs they
    use. Apart where its rows may go apart (rows_may_go_apart) and the pairs saved are at least
    SAVED_PAIRS_PER_ROW a row."""
    if not rows_may_go_apart(step):
        return False
    cu_q, cu_k = step.cu_q.tolist(), step.cu_k.tolist()
    rows = len(cu_q) - 1
    own = sum((cu_q[r + 1] - cu_q[r]) * (cu_k[r + 1] - cu_k[r]) for r in range(rows))
    return cu_q[-1] * cu_k[-1] - own >= SAVED_PAIRS_PER_ROW * rows
