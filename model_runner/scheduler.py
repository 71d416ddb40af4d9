"""Which request runs next: a capped FIFO of waiting requests and at most one running request
(requests run one at a time for now). Pure Python, no torch: the engine owns the model."""
from __future__ import annotations

from collections import deque

from .errors import UserError
from .request import Request, State


class Scheduler:
    def __init__(self, max_queue: int):
        self.max_queue = max_queue
        self.waiting: deque[Request] = deque()
        self.running: Request | None = None

    def add(self, request: Request) -> None:
        if len(self.waiting) >= self.max_queue:
            raise UserError(f"the server is busy: {len(self.waiting)} requests are already waiting "
                            f"(queue cap {self.max_queue}); try again shortly", code="overloaded")
        self.waiting.append(request)

    def remove_waiting(self, request: Request) -> bool:
        try:
            self.waiting.remove(request)
            return True
        except ValueError:
            return False

    def schedule(self) -> Request | None:
        """The request to run one step of: the running one, else the next waiting one (now running)."""
        if self.running is None and self.waiting:
            self.running = self.waiting.popleft()
            self.running.state = State.PREFILL
        return self.running

    def finish_running(self) -> None:
        if self.running is not None:
            self.running.state = State.DONE
        self.running = None

    def positions(self) -> list[tuple[Request, int, int]]:
        """(request, position, ahead) for each waiting request; position 1 = next to run."""
        busy = 1 if self.running is not None else 0
        return [(r, i + 1, i + busy) for i, r in enumerate(self.waiting)]

    def __len__(self) -> int:
        return len(self.waiting) + (self.running is not None)
