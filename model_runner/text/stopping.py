"""Stop conditions over the growing answer: end tokens, stop strings matched across token
boundaries (held back until they can no longer match, never shown), the token budget and the
context window. Timeout and cancel are decided by the engine's clock and callers."""

from __future__ import annotations


class StopChecker:
    def __init__(
        self,
        *,
        eos_ids: frozenset[int],
        stop: tuple[str, ...],
        max_new_tokens: int,
        prompt_tokens: int,
        context_window: int,
    ):
        self.eos_ids = eos_ids
        self.stop = stop
        self.max_new_tokens = max_new_tokens
        self.prompt_tokens = prompt_tokens
        self.context_window = context_window
        self.text = ""  # the answer so far, stop string excluded once matched
        self.released = 0  # how much of self.text has been handed out

    def add(self, token_id: int, new_text: str, generated: int) -> tuple[str, str | None]:
        """Account one generated token. Returns (text to release now, finish reason or None)."""
        if token_id in self.eos_ids:
            return self._release_all(), "eos"
        self.text += new_text
        hit = self._find_stop()
        if hit is not None:
            self.text = self.text[:hit]
            return self._release_all(), "stop_string"
        if self.prompt_tokens + generated >= self.context_window:
            return self._release_all(), "context_full"
        if generated >= self.max_new_tokens:
            return self._release_all(), "max_tokens"
        return self._release_safe(), None

    def flush(self) -> str:
        """Release what is held back (when the request ends for another reason)."""
        return self._release_all()

    def _find_stop(self) -> int | None:
        if not self.stop:
            return None
        # Only the unreleased tail (plus room for a match that started in it) can hold a new match.
        search_from = max(0, self.released - max(len(s) for s in self.stop))
        hits = [i for s in self.stop if (i := self.text.find(s, search_from)) >= 0]
        return min(hits) if hits else None

    def _held_back(self) -> int:
        """Length of the longest suffix of the text that could still grow into a stop string."""
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), longest, -1):
                if self.text.endswith(s[:n]):
                    longest = n
                    break
        return longest

    def _release_safe(self) -> str:
        end = len(self.text) - self._held_back()
        out = self.text[self.released : end] if end > self.released else ""
        self.released = max(self.released, end)
        return out

    def _release_all(self) -> str:
        out = self.text[self.released :]
        self.released = len(self.text)
        return out
