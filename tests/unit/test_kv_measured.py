"""The KV pool's measured figures on the test model: the bytes a request holds are read from its block
table and each layer's K and V tensor layout (so a request whose blocks hold fewer positions than its
count claims is measured short, unlike a count times a constant), and the sampled write check confirms
that each forward wrote the rows expected of it and left the request's other rows alone — and says so
when a forward writes elsewhere or not at all."""

from __future__ import annotations

import pytest
import torch
from kvscope_testkit import ask, events_of

from model_runner.loading import loader
from model_runner.local.kv_cache import SENTINEL, PagedKVPool
from model_runner.local.model.decoders import decoder_for
from model_runner.local.scheduler import Work
from model_runner.local.step.forward import BatchForward
from model_runner.shared.sequence import Sequence

BLOCK = 16


@pytest.fixture
def pool_and_forward():
    loaded = loader.load("fake", "cpu", "auto")
    pool = PagedKVPool(loaded.model, loaded.facts, num_blocks=32, block_size=BLOCK, max_batch_tokens=256)
    return pool, BatchForward(loaded.model, pool, decoder_for(loaded.model, pool))


def request(key: str, prompt: list[int]) -> Sequence:
    return Sequence(id=key, params=ask("hi"), key=key, prompt_ids=list(prompt))


def step(pool: PagedKVPool, forward: BatchForward, seq: Sequence, tokens: list[int]) -> None:
    """One forward of `tokens` new positions of `seq`, through the pool's hooks as the engine runs it."""
    step_together(pool, forward, [(seq, tokens)])


def step_together(pool: PagedKVPool, forward: BatchForward, step_work: list, meddle=lambda: None) -> None:
    """One step's forward over several (request, new tokens) at once, as the engine runs it; `meddle`
    runs between the forward and the check (a stray write elsewhere in the pool)."""
    for seq, tokens in step_work:
        assert pool.reserve(seq, len(tokens))
    work = [
        Work(seq, tokens, "prefill" if seq.cached == 0 else "decode", wants_logits=True) for seq, tokens in step_work
    ]
    with torch.inference_mode():  # as the engine's worker runs it
        complete = pool.completing_step([(w.seq, len(w.tokens)) for w in work])
        forward(work)
        meddle()
        pool.completed_step([w.seq for w in work], complete)


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
    complete = pool.completing_step([(seq, 20)])  # armed, then the forward never ran (a failed step)
    pool.free(seq)
    assert pool.writes.armed == {}
    pool.completed_step([seq], complete)
    assert pool.writes.checked == 0


def prefilled(pool: PagedKVPool, forward: BatchForward, keys: str) -> list[Sequence]:
    """One request per key, each prompt prefilled in a step of its own."""
    seqs = [request(key, range(40 + 10 * n, 60 + 10 * n)) for n, key in enumerate(keys)]
    for seq in seqs:
        step(pool, forward, seq, seq.prompt_ids)
    return seqs


def failures_logged(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.message.startswith("KV write check failed")]


def test_a_step_of_several_requests_is_checked_per_request(pool_and_forward):
    pool, forward = pool_and_forward
    seqs = prefilled(pool, forward, "abc")
    step_together(pool, forward, [(seq, [5, 6]) for seq in seqs])
    assert pool.writes.to_dict() == {"checked": 6, "failed": 0, "last_failure": None}


def test_one_request_whose_write_is_skipped_among_good_ones_is_the_one_reported(pool_and_forward, monkeypatch, caplog):
    pool, forward = pool_and_forward
    seqs = prefilled(pool, forward, "abc")
    alloc = pool.cache.cache_allocators["full_attention"]
    right = alloc.get_write_indices
    skip_b = lambda key, *a: [alloc.write_trash_index] * a[1] if key == "b" else right(key, *a)  # noqa: E731
    monkeypatch.setattr(alloc, "get_write_indices", skip_b)
    step_together(pool, forward, [(seq, [9]) for seq in seqs])
    assert pool.writes.checked == 6 and pool.writes.failed == 1
    assert pool.writes.last_failure == "request b, positions 20-20: a row the step should have written was not"
    assert failures_logged(caplog) == [f"KV write check failed: {pool.writes.last_failure}"]


def test_a_guard_row_changed_in_one_request_among_good_ones_is_the_one_reported(pool_and_forward, caplog):
    pool, forward = pool_and_forward
    seqs = prefilled(pool, forward, "abc")
    first_row_of_c = pool.blocks_of(seqs[2])[0] * pool._allocator.block_physical_stride  # layer 0 K, position 0

    def stray_write():
        pool.rows[first_row_of_c] += 1.0

    step_together(pool, forward, [(seq, [9]) for seq in seqs], meddle=stray_write)
    assert pool.writes.checked == 6 and pool.writes.failed == 1
    assert pool.writes.last_failure == "request c, positions 20-20: a row the step should have left alone changed"
    assert failures_logged(caplog) == [f"KV write check failed: {pool.writes.last_failure}"]


def test_a_request_freed_between_arming_and_the_check_is_not_counted(pool_and_forward):
    pool, forward = pool_and_forward
    a, b = prefilled(pool, forward, "ab")
    for seq in (a, b):
        assert pool.reserve(seq, 1)
    complete = pool.completing_step([(a, 1), (b, 1)])
    pool.free(b)  # its blocks are back in the pool, never written: its watch must not count
    with torch.inference_mode():
        forward([Work(a, [9], "decode", wants_logits=True)])
    pool.completed_step([a], complete[:1])
    assert pool.writes.to_dict() == {"checked": 2 + 1, "failed": 0, "last_failure": None}


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
