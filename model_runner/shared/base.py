"""What both engines share, written once: the loading → ready | failed state (`_status`, `_reason`,
set by their own threads: the built-in engine loads its model, the remote one connects to its
server), the wait for it, and the end listeners' registration."""

from __future__ import annotations

import time
from typing import Any

from model_runner.interface import EndListener
from model_runner.shared.endings import tell_end_listeners

POLL_S = 0.05  # how often wait_ready looks at the state


class EngineBase:
    """Mixed into `Engine` and `RemoteEngine` (model_runner/interface.py declares the whole role)."""

    _status: str = "loading"
    _reason: str | None = None

    def __init__(self) -> None:
        self._end_listeners: list[EndListener] = []
        self._failed_listeners: set[int] = set()  # listeners whose failure was logged once already

    def status(self) -> dict[str, Any]:
        return {"status": self._status, "reason": self._reason}

    def wait_ready(self, timeout: float = 600.0) -> None:
        """Block while the engine is loading; RuntimeError with the reason unless it then is ready."""
        deadline = time.monotonic() + timeout
        while self._status == "loading" and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if self._status != "ready":
            raise RuntimeError(f"engine not ready: {self._status} {self._reason or ''}")

    def add_end_listener(self, fn: EndListener) -> None:
        """Call fn(sequence, terminal event dict) once per request, at its end, before its client sees
        the end. It must be quick and must not call back into the engine (the built-in engine calls it
        with its lock held); whatever it raises is logged, never passed on. From a remote engine the
        sequence has no `prefill_start` and the metrics' `queue_ms`/`prefill_ms` are None: a listener
        must cope with what is not visible from outside the server."""
        self._end_listeners.append(fn)

    def _tell_end_listeners(self, seq, terminal: dict[str, Any]) -> None:
        """Both engines' one loop over the end listeners (shared/endings.py)."""
        tell_end_listeners(self._end_listeners, seq, terminal, self._failed_listeners)
