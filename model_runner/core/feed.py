"""The engine feed: a read-only stream of what the engine does (each step's batch, admissions,
preemptions, endings, policy changes) that any number of observers follow. Publishing never
blocks the worker: each subscriber has a bounded buffer, and a reader that falls behind loses
the newest events and is told how many it lost. Events carry no prompt or answer text unless the
engine was started with `feed_text`."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

FEED_BUFFER = 512  # events a subscriber may fall behind before it starts losing them


class Subscription:
    def __init__(self, feed: "EngineFeed", capacity: int):
        self._feed = feed
        self._events: deque[dict[str, Any]] = deque()
        self._capacity = capacity
        self._ready = threading.Condition()
        self.dropped = 0  # events this reader lost, in all
        self._unreported = 0  # lost since the last event it got
        self.closed = False

    def _offer(self, event: dict[str, Any]) -> None:
        with self._ready:
            if len(self._events) >= self._capacity:
                self.dropped += 1
                self._unreported += 1
                return
            if self._unreported:  # the first event kept after a gap says how many were lost in it
                event = {**event, "dropped": self._unreported}
                self._unreported = 0
            self._events.append(event)
            self._ready.notify_all()

    def next_event(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next event (with `dropped` when events were lost just before it), or None on timeout."""
        with self._ready:
            if not self._events:
                self._ready.wait_for(lambda: bool(self._events) or self.closed, timeout=timeout)
            return self._events.popleft() if self._events else None

    def close(self) -> None:
        self._feed._unsubscribe(self)
        with self._ready:
            self.closed = True
            self._ready.notify_all()


class EngineFeed:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subscribers: list[Subscription] = []
        self.started = time.monotonic()
        self.published = 0

    def subscribe(self, capacity: int = FEED_BUFFER) -> Subscription:
        sub = Subscription(self, capacity)
        with self._lock:
            self._subscribers.append(sub)
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subscribers:
                self._subscribers.remove(sub)

    @property
    def subscribers(self) -> int:
        with self._lock:
            return len(self._subscribers)

    def publish(self, type_: str, **fields: Any) -> None:
        """Stamp and hand an event to every subscriber; cheap when nobody listens."""
        with self._lock:
            subscribers = list(self._subscribers)
            self.published += 1
        if not subscribers:
            return
        event = {"type": type_, "t_ms": round((time.monotonic() - self.started) * 1000, 3), **fields}
        for sub in subscribers:
            sub._offer(event)
