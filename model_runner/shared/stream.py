"""A request's event stream between the engine worker and one consumer: bounded for ordinary
events (a consumer that falls behind makes push() return False, and the engine drops it as a slow
client), while the one terminal event always gets through and nothing follows it."""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable, Iterator

from model_runner.protocol.events import Event
from model_runner.shared.sequence import Sequence


class RequestHandle:
    def __init__(self, sequence: Sequence, capacity: int, canceller: Callable[[Sequence, str], None]):
        self.sequence = sequence
        self.capacity = capacity
        self._canceller = canceller
        self._events: deque[Event] = deque()
        self._ready = threading.Condition()
        self._terminal: Event | None = None
        self.last_position: tuple[int, str] | None = None  # (position, reason) last announced

    @property
    def id(self) -> str:
        return self.sequence.id

    @property
    def submitted_at(self) -> float:
        """The request's time zero (time.monotonic), which every event's t_ms counts from."""
        return self.sequence.submitted_at

    @property
    def done(self) -> bool:
        return self._terminal is not None

    @property
    def terminal(self) -> Event | None:
        return self._terminal

    def push(self, event: Event) -> bool:
        """Queue a non-terminal event; False when the consumer is too far behind (event dropped)."""
        with self._ready:
            if self._terminal is not None:
                return True  # nothing follows the terminal event
            if len(self._events) >= self.capacity:
                return False
            self._events.append(event)
            self._ready.notify_all()
            return True

    def finish(self, event: Event) -> bool:
        """Queue the terminal event; only the first call counts."""
        with self._ready:
            if self._terminal is not None:
                return False
            self._terminal = event
            self._events.append(event)
            self._ready.notify_all()
            return True

    def next_event(self, timeout: float | None = None) -> Event | None:
        """The next event, or None if none came within `timeout` seconds (None = wait forever)."""
        with self._ready:
            if not self._events:
                self._ready.wait_for(lambda: bool(self._events), timeout=timeout)
            return self._events.popleft() if self._events else None

    def __iter__(self) -> Iterator[Event]:
        while True:
            event = self.next_event()
            yield event
            if event.terminal:
                return

    def cancel(self, cause: str = "client") -> None:
        if self._terminal is None:
            self._canceller(self.sequence, cause)
