"""Which request runs next, and every change of a request's state: a capped FIFO of waiting
requests and the running ones (one at a time for now). Pure Python, no torch: the engine owns the
model and asks the scheduler before any request changes state."""
from __future__ import annotations

from collections import deque

from .errors import UserError
from .sequence import Sequence, State


class Scheduler:
    def __init__(self, max_queue: int, max_running: int = 1):
        self.max_queue = max_queue
        self.max_running = max_running
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        """Queue a new request, or raise `overloaded` before anything is emitted for it."""
        if len(self.waiting) >= self.max_queue:
            raise UserError(f"the server is busy: {len(self.waiting)} requests are already waiting "
                            f"(queue cap {self.max_queue}); try again shortly", code="overloaded")
        seq.state = State.QUEUED
        self.waiting.append(seq)

    def schedule(self) -> Sequence | None:
        """The request to run one step of: a running one, else the next waiting one (now in prefill)."""
        if len(self.running) < self.max_running and self.waiting:
            seq = self.waiting.popleft()
            seq.state = State.PREFILL
            self.running.append(seq)
        return self.running[0] if self.running else None

    def prefilled(self, seq: Sequence) -> None:
        """Prefill is done: the request decodes from now on."""
        seq.state = State.DECODE

    def finish(self, seq: Sequence) -> State:
        """The request ends (any reason): out of the queue or the running set. Returns the state it
        ended in, which a cancel reports."""
        was = seq.state
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        seq.state = State.DONE
        return was

    def is_waiting(self, seq: Sequence) -> bool:
        return seq.state == State.QUEUED and seq in self.waiting

    def positions(self) -> list[tuple[Sequence, int, int]]:
        """(request, position, ahead) for each waiting request; position 1 = next to run."""
        busy = len(self.running)
        return [(s, i + 1, i + busy) for i, s in enumerate(self.waiting)]

    def clear(self) -> list[Sequence]:
        """Every request still held (running first), each now DONE; for shutdown."""
        held = [*self.running, *self.waiting]
        for seq in held:
            seq.state = State.DONE
        self.running.clear()
        self.waiting.clear()
        return held

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running)
