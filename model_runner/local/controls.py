"""The local engine's admission controls (part of model_runner/interface.py's `LocalControls`): the
teacher's pause, an experiment's hold on admissions, and withdrawing feed text from requests in
flight. Mixed into `Engine`: they set the scheduler's flags under the engine's lock and wake its
worker, which reads them before each step."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

from model_runner.local.scheduler import Scheduler


class AdmissionControls:
    scheduler: Scheduler
    _lock: threading.Lock
    _wake: threading.Condition  # on _lock: the worker waits on it when there is nothing to run

    def set_paused(self, paused: bool) -> None:
        """Hold (or release) admissions: requests are still accepted and queued, and those running
        carry on, but nothing waiting is admitted while paused (the class view's pause)."""
        with self._lock:
            self.scheduler.paused = bool(paused)
            self._wake.notify_all()

    @property
    def paused(self) -> bool:
        return self.scheduler.paused

    @contextmanager
    def admissions_held(self) -> Iterator[None]:
        """Nothing is admitted inside this block, so requests queued in it are first seen together (an
        experiment's batch); unlike the teacher's pause it can neither undo nor be undone by that."""
        with self._lock:
            self.scheduler.held += 1
        try:
            yield
        finally:
            with self._lock:
                self.scheduler.held -= 1
                self._wake.notify_all()

    def withdraw_feed_text(self) -> None:
        """The teacher turned "show prompts" off: requests still queued or running stop carrying their
        prompt and answer text in the feed from now on (their flag was fixed when they were sent)."""
        with self._lock:
            for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
                seq.feed_text = False
