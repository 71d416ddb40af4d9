"""The scheduler alone (pure Python, no torch): which tokens of which requests each step runs, under
the token budget, the batch cap, chunked prefill, static batching and a pool that runs out of blocks.

A tiny block pool stands in for the paged KV pool, and `run_step` does what the engine's worker does
after a step (the cache grows by the step's tokens; a request whose input is done gets a token and
decodes from then on; it ends at its `max_new_tokens`), so the tests read plans step by step."""

from __future__ import annotations

import math

import pytest

from model_runner.local.scheduler import (
    WAIT_BLOCKS,
    WAIT_LINE,
    WAIT_PREEMPTED,
    WAIT_SLOTS,
    WAIT_STATIC,
    Policy,
    Scheduler,
    StepPlan,
)
from model_runner.protocol.errors import UserError
from model_runner.protocol.request import GenerateParams, Message
from model_runner.shared.sequence import Sequence, State

BLOCK = 16
TOKEN = 7  # what every "sampled" token is


class TinyPool:
    """Blocks of 16 positions, counted per request (the scheduler's BlockPool protocol)."""

    def __init__(self, blocks: int):
        self.total = blocks
        self.held: dict[Sequence, int] = {}

    @property
    def used(self) -> int:
        return sum(self.held.values())

    def reserve(self, seq: Sequence, tokens: int) -> bool:
        need = math.ceil((seq.cached + tokens) / BLOCK) - self.held.get(seq, 0)
        if need > self.total - self.used:
            return False
        if need > 0:
            self.held[seq] = self.held.get(seq, 0) + need
        return True

    def fits(self, seq: Sequence, tokens: int) -> bool:
        return math.ceil((seq.cached + tokens) / BLOCK) - self.held.get(seq, 0) <= self.total - self.used

    def free(self, seq: Sequence) -> int:
        return self.held.pop(seq, 0)

    def match_prefix(self, seq: Sequence) -> int:
        return 0


def seq(name: str, prompt: int, max_new: int = 5, kv_cache: bool = True, prefill_chunk: int = 0) -> Sequence:
    params = GenerateParams(
        messages=(Message("user", name),), max_new_tokens=max_new, kv_cache=kv_cache, prefill_chunk=prefill_chunk
    )
    return Sequence(id=name, key=name, params=params, prompt_ids=[1] * prompt, max_new_tokens=max_new)


def make(pool_blocks: int = 64, **policy) -> tuple[Scheduler, TinyPool]:
    return Scheduler(max_queue=64, policy=Policy(**policy)), TinyPool(pool_blocks)


def run_step(sched: Scheduler, pool: TinyPool) -> StepPlan:
    """Schedule one step, then do the worker's part of it."""
    plan = sched.schedule(pool)
    for w in plan.work:
        w.seq.cached += len(w.tokens)
    for w in plan.work + plan.recompute:
        if w.wants_logits:
            if w.seq.state == State.PREFILL:
                sched.prefilled(w.seq)
            w.seq.output_ids.append(TOKEN)
            if len(w.seq.output_ids) >= w.seq.max_new_tokens:
                sched.finish(w.seq, pool)
    return plan


def shape(plan: StepPlan) -> list[tuple[str, str, int]]:
    """(request, kind, tokens) in the order the step runs them."""
    return [(w.seq.id, w.kind, len(w.tokens)) for w in plan.work + plan.recompute]


def reasons(sched: Scheduler) -> dict[str, str]:
    return {s.id: why for s, _, _, why in sched.positions()}


# ---- batch composition under the token budget -----------------------------------------------------


def test_decode_tokens_come_first_then_prefill_fills_the_token_budget():
    sched, pool = make(max_batch_tokens=64)
    a, b = seq("a", 20, max_new=10), seq("b", 20, max_new=10)
    sched.add(a)
    sched.add(b)
    assert shape(run_step(sched, pool)) == [("a", "prefill", 20), ("b", "prefill", 20)]
    c, d = seq("c", 40), seq("d", 30)
    sched.add(c)
    sched.add(d)
    plan = run_step(sched, pool)
    # Both decode tokens first, then c's whole prompt (2 + 40 <= 64); d's 30 would overrun the budget.
    assert shape(plan) == [("a", "decode", 1), ("b", "decode", 1), ("c", "prefill", 40)]
    assert plan.tokens == 42 and plan.admitted == [c]
    assert d.state == State.QUEUED and list(sched.waiting) == [d]
    plan = run_step(sched, pool)
    assert shape(plan) == [("a", "decode", 1), ("b", "decode", 1), ("c", "decode", 1), ("d", "prefill", 30)]
    assert all(run_step(sched, pool).tokens <= 64 for _ in range(12))


def test_a_prompt_that_waits_for_the_token_budget_is_not_told_it_waits_for_blocks():
    sched, pool = make(max_batch_tokens=64)
    a = seq("a", 20, max_new=10)
    sched.add(a)
    run_step(sched, pool)
    big = seq("big", 80)
    sched.add(big)
    run_step(sched, pool)
    assert big.state == State.QUEUED and pool.used < pool.total // 4
    assert reasons(sched)["big"] == WAIT_SLOTS  # docs/protocol.md: "... or this step's token budget is spent"


def test_a_whole_prompt_over_the_budget_waits_for_a_step_of_its_own_when_chunking_is_off():
    sched, pool = make(max_batch_tokens=32)
    a = seq("a", 10, max_new=4)
    sched.add(a)
    run_step(sched, pool)  # a prefilled; it decodes from now on
    big, small = seq("big", 100, max_new=2), seq("small", 5, max_new=2)
    sched.add(big)
    sched.add(small)
    shapes = []
    while big.state == State.QUEUED:
        shapes.append(shape(run_step(sched, pool)))
        assert small.state == State.QUEUED  # first come, first served: nobody passes the big prompt
    assert shapes[:-1] == [[("a", "decode", 1)]] * (len(shapes) - 1)  # a's decodes run while big waits
    # Once a has ended, the whole 100-token prompt runs alone, over the 32-token budget.
    assert shapes[-1] == [("big", "prefill", 100)] and a.state == State.DONE
    assert shape(run_step(sched, pool)) == [("big", "decode", 1), ("small", "prefill", 5)]


def test_with_chunking_on_the_same_prompt_shares_steps_with_decodes_in_budget_sized_chunks():
    sched, pool = make(max_batch_tokens=32, chunked_prefill=True, chunk_size=64)
    a = seq("a", 10, max_new=20)
    sched.add(a)
    run_step(sched, pool)
    big = seq("big", 100)
    sched.add(big)
    chunks = []
    while big.state != State.DECODE:
        plan = shape(run_step(sched, pool))
        assert plan[0] == ("a", "decode", 1)  # the decode token still comes first, every step
        assert sum(n for _, _, n in plan) <= 32
        chunks += [n for who, kind, n in plan if who == "big"]
    assert chunks == [31, 31, 31, 7]  # the budget left after a's decode token, until the prompt is done
    assert big.cached == 100


def test_chunk_size_limits_each_chunk():
    sched, pool = make(chunked_prefill=True, chunk_size=16)
    big = seq("big", 50)
    sched.add(big)
    assert [shape(run_step(sched, pool)) for _ in range(4)] == [
        [("big", "prefill", 16)],
        [("big", "prefill", 16)],
        [("big", "prefill", 16)],
        [("big", "prefill", 2)],
    ]
    assert big.state == State.DECODE and big.output_ids == [TOKEN]


def test_only_the_last_chunk_asks_for_a_token():
    sched, pool = make(chunked_prefill=True, chunk_size=16)
    sched.add(seq("big", 40))
    wants = [run_step(sched, pool).work[0].wants_logits for _ in range(3)]
    assert wants == [False, False, True]


def test_max_num_seqs_caps_the_running_batch():
    def run(cap):
        sched, pool = make(max_num_seqs=cap)
        for name in "abcd":
            sched.add(seq(name, 10, max_new=3))
        plans = []
        while len(sched):
            plans.append(run_step(sched, pool))
            assert len(sched.running) <= cap
        return sched, plans

    _, plans = run(16)
    assert [sorted(s.id for s in p.admitted) for p in plans] == [["a", "b", "c", "d"], [], []]
    _, plans = run(2)
    assert [sorted(s.id for s in p.admitted) for p in plans] == [["a", "b"], [], [], ["c", "d"], [], []]
    assert max(len(p.work) for p in plans) == 2


def test_a_full_batch_tells_the_next_request_why_it_waits():
    sched, pool = make(max_num_seqs=2)
    for name in "abcd":
        sched.add(seq(name, 10, max_new=3))
    run_step(sched, pool)
    assert reasons(sched) == {"c": WAIT_SLOTS, "d": WAIT_LINE}
    assert [(s.id, pos, ahead) for s, pos, ahead, _ in sched.positions()] == [("c", 1, 2), ("d", 2, 3)]


# ---- static and continuous batching ---------------------------------------------------------------


def admitted_at(batching: str) -> tuple[int, int]:
    """(step at which a late request is admitted, step at which the first batch has ended)."""
    sched, pool = make(batching=batching)
    first = [seq("a", 10, max_new=6), seq("b", 10, max_new=6)]
    for s in first:
        sched.add(s)
    run_step(sched, pool)
    late = seq("late", 10, max_new=2)
    sched.add(late)
    step, admitted, emptied = 1, None, None
    while len(sched):
        step += 1
        plan = run_step(sched, pool)
        if late in plan.admitted:
            admitted = step
        if emptied is None and all(s.state == State.DONE for s in first):
            emptied = step
        if late.state == State.QUEUED and batching == "static":
            assert reasons(sched)["late"] == WAIT_STATIC
    return admitted, emptied


def test_static_batching_admits_a_late_request_only_when_the_batch_has_emptied():
    admitted, emptied = admitted_at("static")
    assert admitted == emptied + 1


def test_continuous_batching_admits_a_late_request_at_the_next_step():
    admitted, emptied = admitted_at("continuous")
    assert admitted == 2 < emptied


def test_static_batching_still_starts_everything_waiting_together_when_idle():
    sched, pool = make(batching="static")
    for name in "abc":
        sched.add(seq(name, 10))
    assert [s.id for s in run_step(sched, pool).admitted] == ["a", "b", "c"]


def test_a_policy_change_applies_from_the_next_schedule():
    sched, pool = make(batching="static")
    sched.add(seq("a", 10, max_new=10))
    run_step(sched, pool)
    late = seq("late", 10)
    sched.add(late)
    run_step(sched, pool)
    assert late.state == State.QUEUED
    sched.policy = sched.policy.updated({"batching": "continuous"})
    assert run_step(sched, pool).admitted == [late]


# ---- preemption -----------------------------------------------------------------------------------


def test_when_blocks_run_out_the_latest_admitted_request_is_preempted_and_recomputes_later():
    sched, pool = make(pool_blocks=3)
    a, b, c = seq("a", 16, max_new=4), seq("b", 16, max_new=4), seq("c", 16, max_new=2)
    for s in (a, b, c):
        sched.add(s)
    run_step(sched, pool)
    assert pool.used == 3  # each prompt fills exactly one block
    plan = run_step(sched, pool)  # every decode token needs a second block: one is free
    # a takes the block c gave back; b finds nobody left to preempt but itself.
    assert [(s.id, freed) for s, freed in plan.preempted] == [("c", 1), ("b", 1)]
    assert shape(plan) == [("a", "decode", 1)]
    assert [s.id for s in sched.waiting] == ["b", "c"]  # back at the head, in their first order
    assert b.state == c.state == State.PREEMPTED and b.preemptions == c.preemptions == 1
    assert b.cached == c.cached == 0 and pool.held == {a: 2}
    while a.state != State.DONE:
        assert b.state == State.PREEMPTED  # nothing to run it with while a holds the blocks
        run_step(sched, pool)
    # b comes back: its prompt and its one token so far in one prefill, then it decodes on.
    plan = run_step(sched, pool)
    assert ("b", "prefill", 17) in shape(plan) and b in plan.admitted
    assert b.cached == 17 and b.state == State.DECODE
    while len(sched):
        run_step(sched, pool)
    assert (len(b.output_ids), len(c.output_ids)) == (4, 2) and pool.used == 0


def test_a_preempted_request_says_it_waits_to_recompute():
    sched, pool = make(pool_blocks=2)
    a, b = seq("a", 16, max_new=4), seq("b", 16, max_new=4)
    sched.add(a)
    sched.add(b)
    run_step(sched, pool)
    plan = run_step(sched, pool)
    assert [s.id for s, _ in plan.preempted] == ["b"]
    assert reasons(sched)["b"] == WAIT_PREEMPTED


def test_a_request_preempted_in_a_step_is_not_admitted_again_in_that_step():
    sched, pool = make(pool_blocks=6, chunked_prefill=True, chunk_size=32)
    for name in "abc":
        sched.add(seq(name, 80, max_new=2))  # 5 blocks each; admitted on their first chunk's 2 blocks
    while len(sched):
        plan = run_step(sched, pool)
        again = {s.id for s, _ in plan.preempted} & {s.id for s in plan.admitted}
        assert not again, f"{sorted(again)} preempted and admitted again in one step: {shape(plan)}"


def test_a_new_request_waits_for_blocks_instead_of_preempting():
    sched, pool = make(pool_blocks=4)
    a = seq("a", 40, max_new=30)  # 3 blocks
    sched.add(a)
    run_step(sched, pool)
    late = seq("late", 40)  # needs 3 blocks, 1 free
    sched.add(late)
    plan = run_step(sched, pool)
    assert plan.preempted == [] and a.state == State.DECODE and late.state == State.QUEUED
    assert reasons(sched)["late"] == WAIT_BLOCKS
    assert pool.held == {a: 3}


# ---- endings and requests without a KV cache ------------------------------------------------------


def test_finish_gives_a_running_request_blocks_back_and_a_waiting_one_none():
    sched, pool = make(max_num_seqs=1)
    a, b = seq("a", 40), seq("b", 40)
    sched.add(a)
    sched.add(b)
    run_step(sched, pool)
    assert sched.finish(b, pool) == (State.QUEUED, 0)
    assert sched.finish(a, pool) == (State.DECODE, 3)
    assert pool.used == 0 and len(sched) == 0 and a.state == b.state == State.DONE


def test_requests_without_a_cache_run_apart_and_hold_no_blocks():
    sched, pool = make()
    a, b = seq("a", 20), seq("nocache", 20, kv_cache=False)
    sched.add(a)
    sched.add(b)
    plan = run_step(sched, pool)
    assert [(w.seq.id, w.kind) for w in plan.work] == [("a", "prefill")]
    assert [(w.seq.id, w.kind, len(w.tokens)) for w in plan.recompute] == [("nocache", "prefill", 20)]
    plan = run_step(sched, pool)
    assert [(w.seq.id, w.kind, len(w.tokens)) for w in plan.recompute] == [("nocache", "recompute", 21)]
    assert b not in pool.held and b.cached == 0


def test_a_request_own_prefill_chunk_applies_even_when_chunking_is_off():
    sched, pool = make()
    sched.add(seq("a", 40, prefill_chunk=16))
    assert [shape(run_step(sched, pool)) for _ in range(3)] == [
        [("a", "prefill", 16)],
        [("a", "prefill", 16)],
        [("a", "prefill", 8)],
    ]


def test_a_full_queue_is_refused_as_overloaded():
    sched = Scheduler(max_queue=2)
    sched.add(seq("a", 4))
    sched.add(seq("b", 4))
    with pytest.raises(UserError) as info:
        sched.add(seq("c", 4))
    assert info.value.code == "overloaded"


# ---- policy validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"bogus": 1}, "bogus"),
        ({"batching": "dynamic"}, "batching"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"max_num_seqs": 257}, "max_num_seqs"),
        ({"max_num_seqs": True}, "max_num_seqs"),
        ({"max_batch_tokens": 15}, "max_batch_tokens"),
        ({"chunk_size": "64"}, "chunk_size"),
        ({"chunked_prefill": 1}, "chunked_prefill"),
        ({"prefix_caching": "yes"}, "prefix_caching"),
    ],
)
def test_a_bad_policy_change_names_its_field(changes, field):
    with pytest.raises(UserError) as info:
        Policy().updated(changes)
    assert info.value.field == field and f"`{field}`" in info.value.message


def test_a_good_policy_change_is_a_new_policy():
    old = Policy()
    new = old.updated({"batching": "static", "max_num_seqs": 4, "chunked_prefill": True})
    assert (new.batching, new.max_num_seqs, new.chunked_prefill) == ("static", 4, True)
    assert old == Policy() and new.to_dict()["max_num_seqs"] == 4
