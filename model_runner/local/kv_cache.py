"""The paged KV pool: transformers' PagedAttentionCache holds every request's keys and values in
fixed-size blocks of one flat tensor; this module reserves and frees blocks per request, shares
full prefix blocks between requests (reference-counted by transformers' block ledger), and accounts
for them: blocks held, bytes reserved, and the bytes a request holds, measured from its block table
and every layer's K and V tensor layout; a sampled write check confirms each step wrote the rows
expected (and no others of the request), so "measured" is not a count times a constant. The check
is armed and read back once a step for all its requests (one gather, one copy from the device)."""

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

from formulas.kv_math import kv_cache_bytes
from model_runner.protocol.errors import UserError
from model_runner.shared.sequence import Sequence

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
        pages = 2 * len(alloc.layer_indices)  # every layer's K and V page of a block, block_size rows each
        self._page_offsets = torch.arange(pages, device=self.rows.device) * block_size
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

    def completing_step(self, step: list[tuple[Sequence, int]]) -> list[dict]:
        """Before a step's forward over (request, new positions) pairs: which blocks each will fill (for
        the prefix index); the write check is armed for the whole step at once."""
        self.writes.arm(self.rows, self._page_offsets, [self._watch(seq, tokens) for seq, tokens in step])
        return [self.cache.count_new_complete_blocks(_CacheState(seq), tokens) for seq, tokens in step]

    def completed_step(self, seqs: list[Sequence], complete: list[dict]) -> None:
        """After that forward: check that it wrote the rows expected of each request (one read back for
        the step), and register the filled blocks' contents so later prompts can share them."""
        self.writes.verify()
        for seq, blocks in zip(seqs, complete):
            self.cache.mark_complete_blocks(_CacheState(seq), blocks)

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
            key=seq.key,
            expected=self._first_rows(table, sorted({new[0], new[-1]})),
            guards=self._first_rows(table, sorted(guards)),
            where=f"request {seq.key}, positions {past}-{past + tokens - 1}",
        )

    def _first_rows(self, table: list[int], positions: list[int]) -> list[int]:
        """Each position's row in `self.rows` on the first page of its block (layer 0's K): a block spans
        block_physical_stride rows, laid out [layer 0 K page | layer 0 V page | layer 1 K page | ...], so
        its rows on the other pages follow at multiples of the block size (`page_offsets`)."""
        stride, size = self._allocator.block_physical_stride, self.block_size
        return [table[p // size] * stride + p % size for p in positions]


def layer_views(allocator) -> list[tuple[int, str, torch.Tensor]]:
    """(layer, "k" or "v", view) for every full-attention layer: transformers' page views of the flat
    tensor, [pages, tokens per page, kv heads, head dim]."""
    views = []
    for layer in allocator.layer_indices:
        keys, values = allocator.get_cache_for_block_table(layer)
        views += [(layer, "k", keys), (layer, "v", values)]
    return views


@dataclass(frozen=True)
class Watch:
    """What one request's forward is checked against: sampled positions it must write, positions it must
    not, each as its first row in the pool (its rows on every layer's K and V page follow from it)."""

    key: str
    expected: list[int]
    guards: list[int]
    where: str


class StepWatch:
    """A step's watches armed and verified together, so the check costs one gather and one read back from
    the device per step, not per request: every watched position of the step in one index tensor
    (expected ones first, then guards), each spread over every page by one broadcast add."""

    def __init__(self, rows: torch.Tensor, page_offsets: torch.Tensor, watches: list[Watch]):
        self.watches, self.rows = watches, rows
        firsts = [r for w in watches for r in w.expected] + [r for w in watches for r in w.guards]
        self.split = sum(len(w.expected) for w in watches)  # positions before it are expected ones
        firsts = torch.tensor(firsts, dtype=torch.long, device=rows.device)  # the step's one copy to the device
        self.index = (firsts[:, None] + page_offsets[None, :]).flatten()  # [positions × pages] row indices
        self.shape = (-1, len(page_offsets), rows[0].numel())  # [positions, pages, one row's elements]
        cut = self.split * len(page_offsets)
        self.before = rows.index_select(0, self.index[cut:]).view(self.shape)
        rows.index_fill_(0, self.index[:cut], SENTINEL)

    def problems(self) -> dict[str, list[str]]:
        """Each watch's failures by request key (an empty list when it held), from one read back."""
        seen = self.rows.index_select(0, self.index).view(self.shape)
        cut = self.split
        unwritten = seen[:cut].eq(SENTINEL).all(-1).any(-1)  # per expected position: a page left unwritten
        changed = seen[cut:].ne(self.before).flatten(1).any(-1)  # per guard position: any element changed
        flags = torch.cat([unwritten, changed]).tolist()  # the one read back from the device
        missed, moved = iter(flags[:cut]), iter(flags[cut:])
        return {w.key: self._report(w, missed, moved) for w in self.watches}

    @staticmethod
    def _report(watch: Watch, missed, moved) -> list[str]:
        """The watch's own flags, taken in order from the step's (expected and guard positions)."""
        unwritten = any([next(missed) for _ in watch.expected])
        changed = any([next(moved) for _ in watch.guards])
        return [
            f"{watch.where}: {what}"
            for what, failed in (
                ("a row the step should have written was not", unwritten),
                ("a row the step should have left alone changed", changed),
            )
            if failed
        ]


@dataclass
class WriteCheck:
    """The tally of write checks: each step arms its requests' watches together before its forward and
    verifies them together after; a request freed in between (a failed step) is not counted."""

    checked: int = 0
    failed: int = 0
    last_failure: str | None = None
    armed: dict[str, Watch] = field(default_factory=dict)
    step: StepWatch | None = None

    def arm(self, rows: torch.Tensor, page_offsets: torch.Tensor, watches: list[Watch | None]) -> None:
        """Arm a step's watches (None: nothing to check for that request), replacing any left armed."""
        watches = [w for w in watches if w is not None]
        self.armed = {w.key: w for w in watches}
        self.step = StepWatch(rows, page_offsets, watches) if watches else None

    def verify(self) -> dict[str, bool]:
        """Per request checked: True when its watch held, False (logged, naming it) when not."""
        step, armed, self.step, self.armed = self.step, self.armed, None, {}
        if step is None or not armed:
            return {}
        results = {}
        for key, problems in step.problems().items():
            if key not in armed:
                continue  # freed after arming: its rows may belong to another request now
            self.checked += 1
            results[key] = not problems
            if problems:
                self.failed += 1
                self.last_failure = problems[0]
                log.error("KV write check failed: %s", "; ".join(problems))
        return results

    def disarm(self, key: str) -> None:
        self.armed.pop(key, None)

    def to_dict(self) -> dict:
        return {"checked": self.checked, "failed": self.failed, "last_failure": self.last_failure}
