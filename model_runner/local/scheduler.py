"""Which tokens of which requests run in the next engine step, and every change of a request's
state. Policies (switchable at run time): continuous or static batching, chunked prefill with a
chunk size, prefix caching, a cap on running requests and a per-step token budget; admission is
first come, first served. When KV blocks run out, the request admitted last is preempted: its
blocks go back to the pool and it waits at the head of the queue to recompute its tokens.
Pure Python, no torch: the pool it asks for blocks is duck-typed (see kv_cache.PagedKVPool)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from model_runner.protocol.errors import UserError
from model_runner.shared.policy import Policy
from model_runner.shared.sequence import Sequence, State

# Why a request is still waiting (sent in `queued` events).
WAIT_NEXT = "next to run"
WAIT_LINE = "in line behind earlier requests"
WAIT_SLOTS = "waiting for a free place in the batch"
WAIT_BLOCKS = "waiting for KV blocks"
WAIT_STATIC = "waiting for the static batch to finish"
WAIT_PREEMPTED = "preempted: waiting to recompute its tokens"
WAIT_PAUSED = "paused by the teacher"


class BlockPool(Protocol):
    def reserve(self, seq: Sequence, tokens: int) -> bool: ...
    def fits(self, seq: Sequence, tokens: int) -> bool: ...
    def free(self, seq: Sequence) -> int: ...
    def match_prefix(self, seq: Sequence) -> int: ...


@dataclass
class Work:
    """One request's share of a step: `tokens` new positions of kind prefill or decode;
    `wants_logits` when they end its pending input, so the step chooses its next token."""

    seq: Sequence
    tokens: list[int]
    kind: str  # "prefill" | "decode" | "recompute" (no KV cache: every position again)
    wants_logits: bool
    chunked: bool = False  # a prefill chunk of a request that prefills in chunks


@dataclass
class StepPlan:
    work: list[Work] = field(default_factory=list)  # batched over the paged pool
    recompute: list[Work] = field(default_factory=list)  # cache-free requests, one forward each
    admitted: list[Sequence] = field(default_factory=list)
    preempted: list[tuple[Sequence, int]] = field(default_factory=list)  # (request, blocks it gave back)

    @property
    def tokens(self) -> int:
        return sum(len(w.tokens) for w in self.work + self.recompute)

    def __bool__(self) -> bool:
        return bool(self.work or self.recompute)


class Scheduler:
    def __init__(self, max_queue: int, policy: Policy = Policy()):
        self.max_queue = max_queue
        self.policy = policy
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.wait_reason: dict[Sequence, str] = {}
        self.paused = False  # admissions held (the class view's pause): requests queue, none is admitted
        self.held = 0  # admissions also held while > 0 (Engine.admissions_held: an experiment queuing its batch)

    # ---- arrivals and endings -----------------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queue a new request, or raise `overloaded` before anything is emitted for it."""
        if len(self.waiting) >= self.max_queue:
            raise UserError(
                f"the server is busy: {len(self.waiting)} requests are already waiting "
                f"(queue cap {self.max_queue}); try again shortly",
                code="overloaded",
            )
        seq.state = State.QUEUED
        self.waiting.append(seq)

    def finish(self, seq: Sequence, pool: BlockPool | None) -> tuple[State, int]:
        """The request ends (any reason): out of the queue or the batch, its blocks back in the pool
        at once. Returns the state it ended in (a cancel reports it) and the blocks it gave back."""
        was = seq.state
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.wait_reason.pop(seq, None)
        holds_blocks = was in (State.PREFILL, State.DECODE) and seq.uses_cache  # waiting ones hold none
        freed = pool.free(seq) if pool is not None and holds_blocks else 0
        seq.state = State.DONE
        return was, freed

    def prefilled(self, seq: Sequence) -> None:
        """Its prompt (or its recompute) is in the cache: it decodes from now on."""
        seq.state = State.DECODE

    def is_waiting(self, seq: Sequence) -> bool:
        return seq.state in (State.QUEUED, State.PREEMPTED) and seq in self.waiting

    # ---- one step -----------------------------------------------------------------------------------

    def schedule(self, pool: BlockPool) -> StepPlan:
        """The next step: every running request's decode token first, then prefill (chunks when
        chunking is on) within the token budget, then new admissions while room remains."""
        plan = StepPlan()
        budget = self.policy.max_batch_tokens
        was_empty = not self.running
        scheduled: set[Sequence] = set()
        for seq in [s for s in self.running if s.state == State.DECODE]:
            if seq in scheduled or seq not in self.running:
                continue
            if not seq.uses_cache:
                plan.recompute.append(Work(seq, seq.tokens, "recompute", True))
            elif self._reserve_or_preempt(seq, 1, pool, plan, scheduled):
                plan.work.append(Work(seq, seq.pending, "decode", True))
                budget -= 1
            else:
                continue
            scheduled.add(seq)
        for seq in [s for s in self.running if s.state == State.PREFILL]:
            if seq in scheduled or seq not in self.running:
                continue
            budget -= self._schedule_prefill(seq, budget, pool, plan, scheduled)
        self._admit(budget, was_empty, pool, plan, scheduled)
        return plan

    def _schedule_prefill(
        self,
        seq: Sequence,
        budget: int,
        pool: BlockPool,
        plan: StepPlan,
        scheduled: set[Sequence],
        may_preempt: bool = True,
    ) -> int:
        """Add the next prefill chunk of a request; returns the tokens it takes. A request being
        admitted (may_preempt False) never preempts others: it waits for blocks instead."""
        if not seq.uses_cache:  # no cache, no chunks: the whole prompt in one forward
            plan.recompute.append(Work(seq, seq.tokens, "prefill", True))
            scheduled.add(seq)
            return len(seq.tokens)
        n = self._chunk(seq, budget, first_in_step=not plan.work)
        if n == 0 or not self._reserve_or_preempt(seq, n, pool, plan, scheduled, may_preempt):
            return 0
        pending = seq.pending
        plan.work.append(Work(seq, pending[:n], "prefill", n == len(pending), chunked=seq.chunk_size > 0))
        scheduled.add(seq)
        return n

    def _chunk_size(self, seq: Sequence) -> int:
        """The chunk size a request is admitted with, kept until its prompt is in: its own
        `prefill_chunk`, else the policy's when chunking is on, at most a step's budget; 0 = whole."""
        if not seq.uses_cache:  # no cache, no chunks: a chunk reads the keys and values of the ones before
            return 0
        size = seq.params.prefill_chunk or (self.policy.chunk_size if self.policy.chunked_prefill else 0)
        return min(size, self.policy.max_batch_tokens)

    def _chunk(self, seq: Sequence, budget: int, first_in_step: bool) -> int:
        """Prompt tokens of `seq` for this step: its next chunk (cut to what is left of the budget,
        at least one token, so a prompt that started in chunks always finishes), else the whole
        pending prompt when it fits the budget or runs alone."""
        pending = len(seq.pending)
        if self.policy.batch_invariant:  # pieces set by the request alone, never cut to the company's leftovers
            piece = self._own_piece(seq)
            return piece if piece <= budget or first_in_step else 0  # too big for what is left: the next step
        if seq.chunk_size:
            return min(pending, seq.chunk_size, max(budget, 1))
        if pending > budget and not first_in_step:
            return 0  # a whole prompt over the budget waits for a step of its own
        return pending

    @staticmethod
    def _own_piece(seq: Sequence) -> int:
        """The mode's next prefill piece, from the request alone: its own chunks from position 0 (the whole
        prompt when it does not chunk), and after a preemption the prompt the same way, then its answer one
        token at a time, so each position is computed at the shape it first was (a decode row)."""
        prompt_left = len(seq.prompt_ids) - seq.cached
        if prompt_left <= 0:
            return 1
        return min(prompt_left, seq.chunk_size or prompt_left)

    def _admit(self, budget: int, was_empty: bool, pool: BlockPool, plan: StepPlan, scheduled: set[Sequence]) -> None:
        """First come, first served: admit waiting requests while the batch, the budget and the pool
        have room; the first that cannot be admitted keeps everyone behind it waiting. A request is
        admitted only when the pool can hold its whole prompt now, so chunked prefill does not admit
        requests that would preempt each other chunk by chunk."""
        if self.paused or self.held:
            if self.paused:
                for behind in self.waiting:
                    self.wait_reason[behind] = WAIT_PAUSED
            return
        static_closed = self.policy.batching == "static" and not was_empty
        preempted_now = {seq for seq, _ in plan.preempted}
        for seq in list(self.waiting):
            reason = self._cannot_admit(seq, static_closed, budget, preempted_now)
            if reason is None and seq.state == State.QUEUED:
                seq.chunk_size = self._chunk_size(seq)
            if reason is None and seq.uses_cache:
                if seq.cached == 0 and seq.preemptions == 0:
                    seq.cached = seq.prefix_hit = pool.match_prefix(seq)
                if self._chunk(seq, budget, first_in_step=not plan.work) == 0:
                    reason = WAIT_SLOTS
                elif not pool.fits(seq, len(seq.pending)):  # checked last: it may evict cached prefixes
                    reason = WAIT_PREEMPTED if seq.state == State.PREEMPTED else WAIT_BLOCKS
            if reason is not None:
                self._undo_prefix_match(seq, pool)
                for i, behind in enumerate(self.waiting):  # it waits, and so does everyone behind it
                    self.wait_reason[behind] = reason if i == 0 else WAIT_LINE
                return
            self.waiting.popleft()
            seq.state = State.PREFILL
            self.running.append(seq)
            budget -= self._schedule_prefill(seq, budget, pool, plan, scheduled, may_preempt=False)
            plan.admitted.append(seq)
            self.wait_reason.pop(seq, None)

    def _cannot_admit(
        self, seq: Sequence, static_closed: bool, budget: int, preempted_now: set[Sequence]
    ) -> str | None:
        if seq in preempted_now:  # just gave its blocks back: taking them again would undo that
            return WAIT_PREEMPTED
        if static_closed:
            return WAIT_STATIC
        if len(self.running) >= self.policy.max_num_seqs or budget <= 0:
            return WAIT_SLOTS
        return None

    def _undo_prefix_match(self, seq: Sequence, pool: BlockPool) -> None:
        """A request that stays waiting gives back the shared prefix blocks it was matched to."""
        if seq.prefix_hit and seq.preemptions == 0 and seq.state == State.QUEUED:
            pool.free(seq)
            seq.cached = seq.prefix_hit = 0

    def _reserve_or_preempt(
        self,
        seq: Sequence,
        tokens: int,
        pool: BlockPool,
        plan: StepPlan,
        scheduled: set[Sequence],
        may_preempt: bool = True,
    ) -> bool:
        """Blocks for `tokens` more positions of `seq`, preempting the latest-admitted requests not
        yet in this step until they fit; False when `seq` itself had to be preempted or must wait."""
        while not pool.reserve(seq, tokens):
            victims = [s for s in self.running if s not in scheduled and s is not seq and s.uses_cache]
            if not may_preempt:
                return False
            if not victims:
                self._preempt(seq, pool, plan)
                return False
            self._preempt(victims[-1], pool, plan)
        return True

    def _preempt(self, seq: Sequence, pool: BlockPool, plan: StepPlan) -> None:
        """Recompute preemption: give its blocks back; it waits at the head of the queue and, when
        admitted again, prefills its prompt and its answer so far in one go."""
        self.running.remove(seq)
        freed = pool.free(seq)
        seq.cached = 0
        seq.preemptions += 1
        seq.state = State.PREEMPTED
        self.waiting.appendleft(seq)
        self.wait_reason[seq] = WAIT_PREEMPTED
        plan.preempted.append((seq, freed))

    # ---- views --------------------------------------------------------------------------------------

    def positions(self) -> list[tuple[Sequence, int, int, str]]:
        """(request, position, ahead, why) for each waiting request; position 1 = next to run."""
        busy = len(self.running)
        return [
            (s, i + 1, i + busy, WAIT_PAUSED if self.paused else self.wait_reason.get(s, WAIT_LINE if i else WAIT_NEXT))
            for i, s in enumerate(self.waiting)
        ]

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running)
