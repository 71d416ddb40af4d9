"""The decode step at static shapes: a decode-only batch (one new token per request) padded to a bucket
of rows (1, 2, 4, 8, 16 …) and of keys (a power of two, at least 256), its inputs written in place into
buffers kept for the pool's life and its mask built on the device from them, so every step of a bucket
runs the same kernels on the same memory — what a CUDA graph captures once and replays (local/step/graphs.py).
Padding rows write to the pool's write-trash slot and see no key; padding keys read the read-trash slot
(zeros, never written) and no real row sees them, so tokens, events and KV accounting are the unpadded
step's. Bucket sizes follow transformers' continuous batching (`pad_to_pow2`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.generation.continuous_batching.utils import pad_to_pow2

from model_runner.local.kv_cache import FULL, PagedKVPool
from model_runner.local.model.paged_step import Decoder, PagedStep
from model_runner.local.scheduler import Work

MAX_ROWS = 256  # the scheduler's largest batch (POLICY_LIMITS["max_num_seqs"])
MIN_KEYS = 256  # the smallest key bucket: short contexts share one shape instead of a shape a step


@dataclass(frozen=True)
class Bucket:
    rows: int  # padded batch rows
    keys: int  # padded key width (all rows' keys, concatenated)


def bucket_for(rows: int, keys: int, max_rows: int, max_keys: int) -> Bucket | None:
    """The bucket a decode batch of `rows` rows reading `keys` keys in all runs in; None when it is wider
    than the buffers (the caller runs it eagerly)."""
    if not 1 <= rows <= max_rows or keys > max_keys:
        return None
    return Bucket(pad_to_pow2(rows, max_rows), pad_to_pow2(keys, max_keys, MIN_KEYS))


def is_decode_batch(rows: list[Work]) -> bool:
    """One new token per request after a stored past, each wanting its next token: the static step's case."""
    return bool(rows) and all(len(r.tokens) == 1 and r.seq.cached > 0 and r.wants_logits for r in rows)


def decode_mask(cu_keys: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, rows, width]: row i sees keys cu_keys[i] … cu_keys[i+1] − 1 (its past and its new token), 0
    there and the dtype's minimum elsewhere — build_attention_mask's decode rows, made on the device."""
    cols = torch.arange(width, device=cu_keys.device)
    visible = (cols >= cu_keys[:-1, None]) & (cols < cu_keys[1:, None])
    mask = torch.full(visible.shape, torch.finfo(dtype).min, dtype=dtype, device=cu_keys.device)
    return mask.masked_fill_(visible, 0)[None, None]


class StaticDecodeStep:
    """The buffers and the forward of the padded decode step. `fill(rows)` writes a batch's inputs (one
    host-to-device copy) and returns its bucket; `run(bucket)` is the capturable part: the device work only."""

    def __init__(self, model, pool: PagedKVPool, decoder: Decoder, max_rows: int = MAX_ROWS, row_by_row: bool = False):
        """row_by_row: batch-invariant mode's steps (PagedStep.row_by_row)."""
        self.model, self.pool, self.decoder, self.row_by_row = model, pool, decoder, row_by_row
        self.device = model.device
        self.max_rows = pad_to_pow2(max_rows, max_rows)
        self.max_keys = pad_to_pow2(pool.total_blocks * pool.block_size + self.max_rows, 2**40, MIN_KEYS)
        alloc = pool.cache.cache_allocators[FULL]
        self.write_trash, self.read_trash = alloc.write_trash_index, alloc.read_trash_index
        # One int64 strip, laid out [ids | positions | write slots | cumulative keys (rows + 1) | read slots].
        r = self.max_rows
        self._at = {"ids": 0, "positions": r, "write": 2 * r, "cu_keys": 3 * r, "read": 4 * r + 1}
        size = 4 * r + 1 + self.max_keys
        pinned = self.device.type == "cuda"
        self.host = torch.zeros(size, dtype=torch.int64, pin_memory=pinned)
        self.strip = (
            self.host if self.device.type == "cpu" else torch.zeros(size, dtype=torch.int64, device=self.device)
        )
        self.rows_q = torch.arange(r + 1, dtype=torch.int32, device=self.device)  # one query per row
        self.steps = 0

    def _view(self, name: str, length: int, source: torch.Tensor | None = None) -> torch.Tensor:
        start = self._at[name]
        return (self.strip if source is None else source)[start : start + length]

    def fill(self, rows: list[Work], min_rows: int = 1) -> Bucket | None:
        """Write a decode batch's inputs into the buffers; its bucket, or None (nothing written) when the
        batch does not fit them. The padding is written too, so no earlier step's input is left behind.
        min_rows: pad to at least this many rows (batch-invariant mode: always the same row count)."""
        read: list[list[int]] = [[]]
        write: list[list[int]] = [[]]
        cu_keys = [0]
        for row in rows:
            past = row.seq.cached
            self.pool.cache.extend_read_and_write_indices(row.seq.key, past, 1, read, write)
            cu_keys.append(cu_keys[-1] + past + 1)
        bucket = bucket_for(len(rows), cu_keys[-1], self.max_rows, self.max_keys)
        if bucket is None or min_rows > self.max_rows:
            return None
        bucket = Bucket(max(bucket.rows, min_rows), bucket.keys)
        pad = bucket.rows - len(rows)
        host = self.host
        self._view("ids", bucket.rows, host)[:] = torch.tensor([r.tokens[0] for r in rows] + [0] * pad)
        self._view("positions", bucket.rows, host)[:] = torch.tensor([r.seq.cached for r in rows] + [0] * pad)
        self._view("write", bucket.rows, host)[:] = torch.tensor(write[0] + [self.write_trash] * pad)
        self._view("cu_keys", bucket.rows + 1, host)[:] = torch.tensor(cu_keys + [cu_keys[-1]] * pad)
        keys = self._view("read", bucket.keys, host)
        keys[: cu_keys[-1]] = torch.tensor(read[0])
        keys[cu_keys[-1] :] = self.read_trash
        if self.strip is not host:  # one transfer for every input of the step
            self.strip.copy_(host, non_blocking=True)
        return bucket

    def run(self, bucket: Bucket) -> torch.Tensor:
        """The padded forward over the buffers → logits [bucket.rows, vocab] (padding rows are garbage).
        Only device work, at the bucket's shapes: a CUDA graph may capture it."""
        rows, keys = bucket.rows, bucket.keys
        cu_keys = self._view("cu_keys", rows + 1)
        return self.decoder.run(
            PagedStep(
                ids=self._view("ids", rows),
                positions=self._view("positions", rows),
                mask=decode_mask(cu_keys, keys, self.model.dtype),
                cu_q=self.rows_q[: rows + 1],
                cu_k=cu_keys,
                max_q=1,
                max_k=keys,
                write=self._view("write", rows),
                read=self._view("read", keys),
                keep=0,  # every row of the bucket wants its next token
                row_by_row=self.row_by_row,
            )
        )
