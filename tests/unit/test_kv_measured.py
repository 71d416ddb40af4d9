"""The KV pool's measured figures on the test model: the bytes a request holds are read from its block
table and each layer's K and V tensor layout (so a request whose blocks hold fewer positions than its
count claims is measured short, unlike a count times a constant), and the sampled write check confirms
that each forward wrote the rows expected of it and left the request's other rows alone — and says so
when a forward writes elsewhere or not at all."""

from __future__ import annotations

import pytest
import torch
from kvscope_testkit import ask, events_of

from model_runner.core.forward import BatchForward
from model_runner.core.kv_cache import SENTINEL, PagedKVPool
from model_runner.core.scheduler import Work
from model_runner.core.sequence import Sequence
from model_runner.loading import loader

BLOCK = 16


@pytest.fixture
def pool_and_forward():
    loaded = loader.load("fake", "cpu", "auto")
    pool = PagedKVPool(loaded.model, loaded.facts, num_blocks=32, block_size=BLOCK, max_batch_tokens=256)
    return pool, BatchForward(loaded.model, pool)


def request(key: str, prompt: list[int]) -> Sequence:
    return Sequence(id=key, params=ask("hi"), key=key, prompt_ids=list(prompt))


def step(pool: PagedKVPool, forward: BatchForward, seq: Sequence, tokens: list[int]) -> None:
    """One forward of `tokens` new positions of `seq`, through the pool's hooks as the engine runs it."""
    assert pool.reserve(seq, len(tokens))
    with torch.inference_mode():  # as the engine's worker runs it
        complete = pool.completing(seq, len(tokens))
        forward([Work(seq, tokens, "prefill" if seq.cached == 0 else "decode", wants_logits=True)])
        pool.completed(seq, complete)


def independent_bytes(pool: PagedKVPool, positions: int) -> int:
    """The same rows counted from the flat tensor's own layout: every layer's K and V page of a block."""
    alloc = pool.cache.cache_allocators["full_attention"]
    row = alloc.num_key_value_heads * alloc.head_dim * alloc.cache_dtype.itemsize
    return positions * row * 2 * len(alloc.layer_indices)


def test_held_bytes_are_the_rows_its_blocks_hold(pool_and_forward):
    pool, forward = pool_and_forward
    seq = request("a", range(40, 80))  # 40 positions: three blocks, the last one part full
    step(pool, forward, seq, seq.prompt_ids)
    assert len(pool.blocks_of(seq)) == 3
    assert pool.held_bytes(seq) == independent_bytes(pool, 40) == pool.formula_bytes(40)
    step(pool, forward, seq, [7])
    assert pool.held_bytes(seq) == independent_bytes(pool, 41)


def test_a_block_missing_from_the_table_is_measured_short_not_counted(pool_and_forward):
    pool, forward = pool_and_forward
    seq = request("a", range(40, 80))
    step(pool, forward, seq, seq.prompt_ids)
    table = pool.cache.cache_allocators["full_attention"].block_table[seq.key]
    table.pop()  # the pool lost its last block: 8 of the 40 positions are no longer held
    assert pool.held_bytes(seq) == independent_bytes(pool, 32)
    assert pool.computed_bytes(seq.cached) == independent_bytes(pool, 40)  # a count times a constant cannot see it


def test_each_forward_passes_the_write_check(pool_and_forward):
    pool, forward = pool_and_forward
    a, b = request("a", range(40, 70)), request("b", range(90, 100))
    step(pool, forward, a, a.prompt_ids)
    step(pool, forward, b, b.prompt_ids)
    for token in (5, 6, 7):
        step(pool, forward, a, [token])
    assert pool.writes.to_dict() == {"checked": 5, "failed": 0, "last_failure": None}


def misdirect(pool: PagedKVPool, monkeypatch, shift: int) -> None:
    """Make transformers write every new row `shift` rows past where it belongs (a broken slot mapping)."""
    alloc = pool.cache.cache_allocators["full_attention"]
    right = alloc.get_write_indices
    monkeypatch.setattr(alloc, "get_write_indices", lambda *a: [i + shift for i in right(*a)])


def test_a_forward_that_writes_one_row_off_fails_the_check(pool_and_forward, monkeypatch):
    pool, forward = pool_and_forward
    seq = request("a", range(40, 60))
    step(pool, forward, seq, seq.prompt_ids)
    misdirect(pool, monkeypatch, 1)
    step(pool, forward, seq, [9])
    assert pool.writes.failed == 1 and "request a" in pool.writes.last_failure
    assert pool.held_bytes(seq) == independent_bytes(pool, 21)  # the table still holds 21: the check is what tells


def test_a_forward_that_writes_nothing_fails_the_check(pool_and_forward, monkeypatch):
    pool, forward = pool_and_forward
    seq = request("a", range(40, 60))
    step(pool, forward, seq, seq.prompt_ids)
    alloc = pool.cache.cache_allocators["full_attention"]
    monkeypatch.setattr(alloc, "get_write_indices", lambda *a: [alloc.write_trash_index] * a[2])
    step(pool, forward, seq, [9])
    assert pool.writes.failed == 1 and "should have written" in pool.writes.last_failure


def test_the_check_leaves_the_cache_as_the_forward_wrote_it(pool_and_forward):
    pool, forward = pool_and_forward
    seq = request("a", range(40, 60))
    step(pool, forward, seq, seq.prompt_ids)
    step(pool, forward, seq, [9])
    for _, _, view in pool.views:
        for position in range(seq.cached):
            page = pool.blocks_of(seq)[position // BLOCK] * len(pool.views)  # pages per block: K and V of each layer
            assert not torch.all(view[page, position % BLOCK] == SENTINEL)


def test_freeing_a_request_drops_its_armed_watch(pool_and_forward):
    pool, forward = pool_and_forward
    seq = request("a", range(40, 60))
    assert pool.reserve(seq, 20)
    pool.completing(seq, 20)  # armed, then the forward never ran (a failed step)
    pool.free(seq)
    assert pool.writes.armed == {} and pool.writes.checked == 0


def test_the_engines_measured_figure_is_what_the_pool_holds(engine_factory, monkeypatch):
    """The events' cache_bytes_measured comes from held_bytes (the pool), not from the engine's own count."""
    engine = engine_factory("fake")
    monkeypatch.setattr(PagedKVPool, "rows_held", lambda self, seq: max(0, seq.cached - 1))  # a position short
    events = events_of(engine.submit(ask("hi", max_new_tokens=4), "r"))
    per_token = engine.facts.kv_bytes_per_token
    figures = [e for e in events if e["type"] in ("prefill_end", "token")]
    assert figures and all(e["cache_bytes_measured"] == (e["cache_tokens"] - 1) * per_token for e in figures)
    assert all(e["cache_bytes_formula"] == e["cache_tokens"] * per_token for e in figures)
    assert engine.pool.writes.checked >= 4 and engine.pool.writes.failed == 0
