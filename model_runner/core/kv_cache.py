"""The paged KV pool: transformers' PagedAttentionCache holds every request's keys and values in
fixed-size blocks of one flat tensor; this module reserves and frees blocks per request, shares
full prefix blocks between requests (reference-counted by transformers' block ledger), and accounts
for them: blocks held, bytes reserved, and the bytes a request holds, measured from its block table
and every layer's K and V tensor layout; a sampled write check confirms each step wrote the rows
expected (and no others of the request), so "measured" is not a count times a constant."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

import torch
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching import PagedAttentionCache
from transformers.generation.continuous_batching.distributed import DistributedHelper
from transformers.generation.continuous_batching.initialization import resolve_continuous_batching_config
from transformers.generation.continuous_batching.requests import RequestStatus

from model_runner.core.sequence import Sequence
from model_runner.errors import UserError
from model_runner.kv_math import kv_cache_bytes

FULL = "full_attention"  # the allocator of full-attention layers (every layer of a Llama)
# Written into the sampled rows a step must fill, just before it runs: a key or value row the model wrote
# is never all -2048 (exact in float32, bfloat16 and float16), so a row still all SENTINEL was not written.
SENTINEL = -2048.0
log = logging.getLogger("kvscope.engine")
# transformers logs its cache sizing at INFO on every pool made; kvscope reports the pool itself.
logging.getLogger("ContinuousBatchingLogger").setLevel(logging.WARNING)


def blocks_for_megabytes(megabytes: float, facts, block_size: int) -> int:
    """How many blocks of `block_size` tokens fit in `megabytes` MiB (formula bytes per token)."""
    return int(megabytes * 2**20 // (facts.kv_bytes_per_token * block_size))


MIN_DEFAULT_POSITIONS = 4096  # small-window models (the 512-token test model) still batch a class's requests


def default_blocks(facts, block_size: int) -> int:
    """Room for one full context window (at least 4,096 positions): the longest request always
    fits, and shorter ones share the pool (16 requests of 512 tokens for SmolLM2's 8,192-token
    window: 360 MiB in float32)."""
    return math.ceil(max(facts.context_window, MIN_DEFAULT_POSITIONS) / block_size)


@dataclass(frozen=True)
class PoolUsage:
    total: int  # blocks in the pool
    used: int  # blocks held by requests
    cached: int  # blocks no request holds, kept for their prefix (freed under pressure)
    free: int
    block_size: int  # tokens per block
    bytes_per_block: int

    def to_dict(self) -> dict:
        return {
            "total": self.total,
            "used": self.used,
            "cached": self.cached,
            "free": self.free,
            "block_size": self.block_size,
            "bytes_per_block": self.bytes_per_block,
        }


class _CacheState:
    """What transformers' cache reads of a request: its id, how many tokens it holds, its tokens."""

    status = RequestStatus.DECODING  # mark_complete_blocks skips FINISHED requests only

    def __init__(self, seq: Sequence):
        self.request_id = seq.key
        self._seq = seq
        self.initial_tokens = seq.prompt_ids
        self.generated_tokens = seq.output_ids

    def current_len(self) -> int:
        return self._seq.cached


class PagedKVPool:
    def __init__(self, model, facts, num_blocks: int, block_size: int, max_batch_tokens: int):
        if num_blocks < 1:
            raise UserError(
                f"the KV cache pool must hold at least one block of {block_size} tokens; raise --kv-cache-mb",
                field="kv_cache_mb",
            )
        config = ContinuousBatchingConfig(
            page_size=block_size,
            num_blocks=num_blocks,
            max_batch_tokens=max_batch_tokens,
            allow_block_sharing=True,
            max_blocks_per_request=0,
        )
        config = resolve_continuous_batching_config(model.config, config, None, False, device=model.device)
        self.cache = PagedAttentionCache(
            model.config,
            config,
            model.device,
            DistributedHelper(None, None),
            dtype=model.dtype,
            model_supports_logits_to_keep=True,
        )
        self.facts = facts
        self.block_size = block_size
        self._allocator = self.cache.cache_allocators[FULL]
        self.total_blocks = self.cache.num_blocks
        self.bytes_per_block = self._allocator.bytes_per_block
        # The data part of the flat tensor (its two trash sectors left out) per token it holds: a
        # tensor-size figure: times a count it is computed, not measured (computed_bytes).
        data_bytes = self.cache.cache_tensor.nbytes - 2 * self.cache.bytes_per_sector
        self.tensor_bytes_per_token = data_bytes // (self.total_blocks * block_size)
        self.views = layer_views(self._allocator)
        alloc = self._allocator
        self.rows = alloc.cache_tensor.view(-1, alloc.num_key_value_heads, alloc.head_dim)  # one K or V row each
        self.writes = WriteCheck()
        self.set_prefix_caching(False)

    # ---- policy ----------------------------------------------------------------------------------

    @property
    def prefix_caching(self) -> bool:
        return self.cache.use_prefix_sharing

    def set_prefix_caching(self, on: bool) -> None:
        """Off: no prefix is matched or registered, and blocks kept only for their prefix go back to the pool."""
        self.cache.allow_block_sharing = self.cache.use_prefix_sharing = on
        if not on:
            self.cache.evict_cached_blocks()

    # ---- per request -----------------------------------------------------------------------------

    def reserve(self, seq: Sequence, tokens: int) -> bool:
        """Blocks for `tokens` more positions of `seq`; False (nothing changed) when the pool is short,
        after giving back blocks that are only cached for their prefix."""
        state = _CacheState(seq)
        if self.cache.can_store_request_tokens(state, tokens):
            return True
        return self.cache.evict_cached_blocks() and self.cache.can_store_request_tokens(state, tokens)

    def fits(self, seq: Sequence, tokens: int) -> bool:
        """Whether `tokens` more positions of `seq` fit now (nothing is reserved); blocks kept only
        for their prefix are given back if that makes the difference."""
        state = _CacheState(seq)
        if self.cache.can_store_request_tokens(state, tokens, dry_run=True):
            return True
        return self.cache.evict_cached_blocks() and self.cache.can_store_request_tokens(state, tokens, dry_run=True)

    def match_prefix(self, seq: Sequence) -> int:
        """Share the full blocks of a cached identical prompt prefix with `seq`; the tokens matched."""
        return self.cache.search_prefix_match(seq.key, seq.prompt_ids) if self.prefix_caching else 0

    def completing(self, seq: Sequence, tokens: int) -> dict:
        """Before a forward over `tokens` new positions: which blocks it will fill (for the prefix index);
        the write check is armed for those positions."""
        self.writes.arm(seq.key, self._watch(seq, tokens))
        return self.cache.count_new_complete_blocks(_CacheState(seq), tokens)

    def completed(self, seq: Sequence, complete: dict) -> None:
        """After that forward: register the filled blocks' contents so later prompts can share them,
        and check that the forward wrote the rows expected of it."""
        self.writes.verify(seq.key)
        self.cache.mark_complete_blocks(_CacheState(seq), complete)

    def free(self, seq: Sequence) -> int:
        """Give back every block `seq` holds; returns how many it held."""
        held = len(self.blocks_of(seq))
        self.writes.disarm(seq.key)
        # Without prefix caching a freed block goes straight back to the pool, not to the cached ones.
        self.cache.free_blocks(seq.key, no_cache=not self.prefix_caching)
        return held

    def blocks_of(self, seq: Sequence) -> list[int]:
        return list(self._allocator.block_table.get(seq.key, ()))

    def shared_blocks_of(self, seq: Sequence) -> list[int]:
        """The blocks of `seq` that other requests hold too (a shared prefix)."""
        shared = self._allocator.ledger.shared_ref_counts
        return [b for b in self.blocks_of(seq) if b in shared]

    def blocks_needed(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    # ---- accounting ------------------------------------------------------------------------------

    def usage(self) -> PoolUsage:
        pool = self.cache.pool
        free = pool.count_free_blocks(self._allocator.index) + pool.num_free_sectors * self._allocator.blocks_per_sector
        cached = len(self._allocator.ledger.cached_blocks)
        return PoolUsage(
            self.total_blocks, self.total_blocks - free - cached, cached, free, self.block_size, self.bytes_per_block
        )

    def computed_bytes(self, tokens: int) -> int:
        """Computed: `tokens` positions times the cache tensor's bytes per position (its size over its capacity)."""
        return tokens * self.tensor_bytes_per_token

    def rows_held(self, seq: Sequence) -> int:
        """Positions of `seq` that its block table holds: each block up to `seq.cached`, at most a block each."""
        size, cached = self.block_size, seq.cached
        return sum(max(0, min(size, cached - i * size)) for i in range(len(self.blocks_of(seq))))

    def held_bytes(self, seq: Sequence) -> int:
        """Measured: the bytes of the rows that hold `seq`'s positions, read from the pool: the rows its
        block table holds, and for every layer's K and V tensor its element size times its row stride."""
        return self.rows_held(seq) * sum(view.element_size() * view.stride(1) for _, _, view in self.views)

    def formula_bytes(self, tokens: int) -> int:
        f = self.facts
        return kv_cache_bytes(f.layers, f.kv_heads, f.head_dim, f.bytes_per_element, tokens)

    def reserved_bytes(self, seq: Sequence) -> int:
        return len(self.blocks_of(seq)) * self.bytes_per_block

    @property
    def pool_bytes(self) -> int:
        return self.total_blocks * self.bytes_per_block

    # ---- the write check ----------------------------------------------------------------------------

    def _watch(self, seq: Sequence, tokens: int) -> Watch | None:
        """A sampled watch over every layer's K and V: the first and last rows this forward must write, and
        rows of `seq` it must leave alone (its first and latest written positions, the free slot after)."""
        table, size, past = self.blocks_of(seq), self.block_size, seq.cached
        capacity = len(table) * size
        if tokens < 1 or past + tokens > capacity:
            return None  # nothing to write, or its blocks are not reserved: the forward itself refuses
        new = range(past, past + tokens)
        guards = {p for p in (0, past - 1, past + tokens) if 0 <= p < capacity and p not in new}
        return Watch(
            rows=self.rows,
            expected=self._flat_rows(table, sorted({new[0], new[-1]})),
            guards=self._flat_rows(table, sorted(guards)),
            where=f"request {seq.key}, positions {past}-{past + tokens - 1}",
        )

    def _flat_rows(self, table: list[int], positions: list[int]) -> torch.Tensor:
        """The rows of `positions` in `self.rows`, for every layer's K and V: a block spans
        block_physical_stride rows, laid out [layer 0 K page | layer 0 V page | layer 1 K page | ...]."""
        alloc, size = self._allocator, self.block_size
        pages = range(2 * len(alloc.layer_indices))
        rows = [
            table[p // size] * alloc.block_physical_stride + page * size + p % size for p in positions for page in pages
        ]
        return torch.tensor(rows, dtype=torch.long, device=self.rows.device)


def layer_views(allocator) -> list[tuple[int, str, torch.Tensor]]:
    """(layer, "k" or "v", view) for every full-attention layer: transformers' page views of the flat
    tensor, [pages, tokens per page, kv heads, head dim]."""
    views = []
    for layer in allocator.layer_indices:
        keys, values = allocator.get_cache_for_block_table(layer)
        views += [(layer, "k", keys), (layer, "v", values)]
    return views


@dataclass
class Watch:
    """What one request's forward is checked against: sampled rows it must write, rows it must not."""

    rows: torch.Tensor  # the pool as rows of [kv heads, head dim]
    expected: torch.Tensor  # row indices
    guards: torch.Tensor
    where: str
    before: torch.Tensor | None = None

    def arm(self) -> None:
        self.before = self.rows.index_select(0, self.guards)
        self.rows.index_fill_(0, self.expected, SENTINEL)

    def problems(self) -> list[str]:
        unwritten = self.rows.index_select(0, self.expected).eq(SENTINEL).flatten(1).all(1).any()
        changed = self.rows.index_select(0, self.guards).ne(self.before).any()
        missed, moved = torch.stack([unwritten, changed]).tolist()  # one read back from the device
        return [
            f"{self.where}: {what}"
            for what, failed in (
                ("a row the step should have written was not", missed),
                ("a row the step should have left alone changed", moved),
            )
            if failed
        ]


@dataclass
class WriteCheck:
    """The tally of write checks: each step arms a watch per request before its forward and verifies it after."""

    checked: int = 0
    failed: int = 0
    last_failure: str | None = None
    armed: dict[str, Watch] = field(default_factory=dict)

    def arm(self, key: str, watch: Watch | None) -> None:
        self.armed.pop(key, None)
        if watch is not None:
            watch.arm()
            self.armed[key] = watch

    def verify(self, key: str) -> bool | None:
        """True when the watch over `key`'s last forward held, False (logged) when not, None when none was armed."""
        watch = self.armed.pop(key, None)
        if watch is None:
            return None
        problems = watch.problems()
        self.checked += 1
        if problems:
            self.failed += 1
            self.last_failure = problems[0]
            log.error("KV write check failed: %s", "; ".join(problems))
        return not problems

    def disarm(self, key: str) -> None:
        self.armed.pop(key, None)

    def to_dict(self) -> dict:
        return {"checked": self.checked, "failed": self.failed, "last_failure": self.last_failure}
