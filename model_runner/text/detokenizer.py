"""Incremental detokenization on bytes: each token's bytes join a buffer and only complete UTF-8
characters are released, so a character split across tokens (an emoji) is pending, never U+FFFD."""

from __future__ import annotations

from model_runner.text.tokenizer import ByteTokenizer, HFTokenizer


def _complete_prefix_len(buf: bytes) -> int:
    """Length of the longest prefix of `buf` that ends on a UTF-8 character boundary."""
    n = len(buf)
    i = n - 1
    # Walk back over at most 3 continuation bytes to the lead byte of the last character.
    while i >= 0 and n - i <= 4 and (buf[i] & 0xC0) == 0x80:
        i -= 1
    if i < 0:
        return n
    lead = buf[i]
    need = (
        1
        if lead < 0x80
        else 2
        if lead >> 5 == 0b110
        else 3
        if lead >> 4 == 0b1110
        else 4
        if lead >> 3 == 0b11110
        else 1
    )
    return n if n - i >= need else i


class IncrementalDetokenizer:
    def __init__(self, tokenizer: HFTokenizer | ByteTokenizer):
        self.tokenizer = tokenizer
        self.pending = b""

    def feed(self, token_id: int) -> str:
        """Text completed by this token ('' while a character is still pending). Special tokens add
        no text. Bytes that can never form a character are dropped rather than shown as U+FFFD."""
        if token_id in self.tokenizer.special_ids:
            return ""
        self.pending += self.tokenizer.token_bytes(token_id)
        cut = _complete_prefix_len(self.pending)
        ready, self.pending = self.pending[:cut], self.pending[cut:]
        if len(self.pending) >= 4:  # longer than any character: it will never complete
            ready, self.pending = ready + self.pending, b""
        return ready.decode("utf-8", errors="ignore")

    @property
    def is_pending(self) -> bool:
        return bool(self.pending)


def display_text(tokenizer: HFTokenizer | ByteTokenizer, token_id: int) -> str:
    """A token's text for display on its own (candidates): incomplete bytes are shown escaped."""
    return tokenizer.token_bytes(token_id).decode("utf-8", errors="backslashreplace")
