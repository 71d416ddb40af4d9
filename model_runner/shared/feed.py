"""The engine feed: a read-only stream of what the engine does (each step's batch, admissions,
preemptions, endings, policy changes) that any number of observers follow. Publishing never
blocks the worker: each subscriber has a bounded buffer, and a reader that falls behind loses
the newest events and is told how many it lost. The feed keeps its last STEP_HISTORY step events,
so a view opened late can ask for the recent past (`catch_up`). Events carry no prompt or answer
text unless the engine was started with `feed_text`; step events never do."""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

FEED_BUFFER = 512  # events a subscriber may fall behind before it starts losing them
# The steps the class view's batch grid shows (HISTORY_STEPS in static/js/class/feed-state.js; a
# test checks the two agree): what a projector opened late is given of the steps before it.
STEP_HISTORY = 48
STEP = "engine_step"


class Subscription:
    def __init__(self, feed: "EngineFeed", capacity: int, joined_at: int):
        self._feed = feed
        self._events: deque[dict[str, Any]] = deque()
        self._history: deque[dict[str, Any]] = deque()  # given before any live event; never dropped
        self._capacity = capacity
        self._ready = threading.Condition()
        self._joined_at = joined_at  # the number of the first event published to this subscription
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

    def interleave(self, event: dict[str, Any]) -> None:
        """An event from outside the engine (the class room's state and stats) into this reader's
        stream: in order with the feed's own events, never blocking the sender, and lost like them
        when the reader falls behind."""
        self._offer(event)

    def catch_up(self) -> None:
        """Give this reader the feed's last steps published before it subscribed, ahead of everything
        else and marked `"history": true`: no step twice, none missed between them and the live ones."""
        earlier = [
            {**event, "history": True} for number, event in self._feed.recent_steps() if number < self._joined_at
        ]
        with self._ready:
            self._history.extend(earlier)
            self._ready.notify_all()

    def next_event(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next event (with `dropped` when events were lost just before it), or None on timeout."""
        with self._ready:
            if not self._history and not self._events:
                self._ready.wait_for(lambda: bool(self._history or self._events) or self.closed, timeout=timeout)
            if self._history:
                return self._history.popleft()
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
        self._steps: deque[tuple[int, dict[str, Any]]] = deque(maxlen=STEP_HISTORY)  # (event number, event)
        self.started = time.monotonic()
        self.published = 0

    def subscribe(self, capacity: int = FEED_BUFFER) -> Subscription:
        with self._lock:
            sub = Subscription(self, capacity, joined_at=self.published)
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

    def recent_steps(self) -> list[tuple[int, dict[str, Any]]]:
        """The last STEP_HISTORY step events with their numbers in publishing order, oldest first."""
        with self._lock:
            return list(self._steps)

    def publish(self, type_: str, **fields: Any) -> None:
        """Stamp and hand an event to every subscriber; cheap when nobody listens (a step is kept)."""
        with self._lock:
            subscribers = list(self._subscribers)
            number = self.published
            self.published += 1
            if not subscribers and type_ != STEP:
                return
            event = {"type": type_, "t_ms": round((time.monotonic() - self.started) * 1000, 3), **fields}
            if type_ == STEP:  # numbered under the lock: each step is either history or live to a new reader
                self._steps.append((number, event))
        for sub in subscribers:
            sub._offer(event)
