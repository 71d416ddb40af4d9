"""The progress bar on stderr, with an ETA from work weighted by tokens to process; it never
changes what is measured."""

from __future__ import annotations

import sys
import time


class Progress:
    """A one-line progress bar on stderr (a line per step when stderr is not a terminal), with an
    ETA from the work done so far; work is weighted by tokens to process."""

    def __init__(self, total: float, enabled: bool = True, stream=None):
        self.total, self.done, self.enabled = max(total, 1e-9), 0.0, enabled
        self.stream = stream or sys.stderr
        self.started = time.monotonic()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def step(self, label: str, weight: float) -> None:
        if self.enabled:
            elapsed = time.monotonic() - self.started
            eta = f"{elapsed * (self.total - self.done) / self.done:4.0f}s left" if self.done else "   ? left"
            filled = int(24 * self.done / self.total)
            line = f"[{'#' * filled}{'.' * (24 - filled)}] {100 * self.done / self.total:3.0f}% {eta}  {label}"
            self.stream.write(f"\r{line:<110}" if self.tty else line + "\n")
            self.stream.flush()
        self.done += weight

    def close(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\r" + " " * 110 + "\r")
            self.stream.flush()


def work(prompt: int, output: int) -> float:
    """Relative cost of one generation, for the ETA: on 2 CPU cores a prefill token cost about a
    fifteenth of a decode step."""
    return prompt / 15 + output
