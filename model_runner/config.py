"""The engine's settings and the server's limits, in one place: the engine reads EngineConfig, the
Flask app's DEFAULTS and the `kvscope serve` flags take their defaults from the same constants."""
from __future__ import annotations

from dataclasses import dataclass

MAX_QUEUE = 64  # requests waiting at once; the next one is answered `overloaded` at once
TIMEOUT_S = 120.0  # server-side limit per request, from submit
EVENT_BUFFER = 1024  # events a client may fall behind before it is dropped as slow


@dataclass(frozen=True)
class EngineConfig:
    model: str = "default"  # "default" (bundled SmolLM2-135M-Instruct), "fake" (tests), a hub id or a path
    device: str = "auto"
    dtype: str = "auto"
    max_queue: int = MAX_QUEUE
    timeout_s: float = TIMEOUT_S
    event_buffer: int = EVENT_BUFFER
