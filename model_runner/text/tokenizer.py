"""One tokenizer interface for the engine: encode with character offsets, exact bytes per token,
the chat template, and end-of-turn ids — over a transformers tokenizer or the test byte tokenizer."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte↔unicode table, inverted: the visible character → the raw byte it stands for."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class HFTokenizer:
    """Adapter over a transformers (fast) tokenizer."""

    def __init__(self, tok: Any, eos_ids: set[int]):
        self.tok = tok
        self.eos_ids = frozenset(eos_ids)
        self.special_ids = frozenset(tok.all_special_ids) | {
            i for i, t in tok.added_tokens_decoder.items() if t.special
        }
        self.chat_template = tok.chat_template
        self._style = self._detect_style()
        self._bytes_cache: dict[int, bytes] = {}

    def _detect_style(self) -> str:
        try:
            decoder = json.dumps(json.loads(self.tok.backend_tokenizer.to_str()).get("decoder"))
        except Exception:  # slow tokenizers have no backend: fall back to decode()
            return "decode"
        if "ByteLevel" in decoder:
            return "byte_level"
        if "ByteFallback" in decoder:
            return "byte_fallback"
        return "decode"

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]

    def token_bytes(self, token_id: int) -> bytes:
        cached = self._bytes_cache.get(token_id)
        if cached is None:
            cached = self._bytes_cache[token_id] = self._token_bytes(token_id)
        return cached

    def _token_bytes(self, token_id: int) -> bytes:
        piece = self.tok.convert_ids_to_tokens(token_id)
        if token_id in self.special_ids or piece is None:
            return (piece or "").encode()
        if self._style == "byte_level":
            table = _byte_level_decoder()
            if all(ch in table for ch in piece):
                return bytes(table[ch] for ch in piece)
        if self._style == "byte_fallback":
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                return bytes([int(piece[3:5], 16)])
            return piece.replace("\u2581", " ").encode()
        return self.tok.decode([token_id]).encode()


class ByteTokenizer:
    """Test tokenizer: one token per UTF-8 byte, plus ChatML markers; renders a ChatML template
    that, like SmolLM2's, inserts a default system prompt when none is given."""

    IM_START, IM_END, EOT = 256, 257, 258
    SPECIALS = {IM_START: "<|im_start|>", IM_END: "<|im_end|>", EOT: "<|endoftext|>"}
    DEFAULT_SYSTEM = "You are a tiny test model."
    vocab_size = 259

    def __init__(self):
        self.eos_ids = frozenset({self.IM_END, self.EOT})
        self.special_ids = frozenset(self.SPECIALS)
        self.chat_template = "chatml-bytes"

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        parts = []
        if not messages or messages[0]["role"] != "system":
            parts.append(f"<|im_start|>system\n{self.DEFAULT_SYSTEM}<|im_end|>\n")
        parts += [f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages]
        parts.append("<|im_start|>assistant\n")
        return "".join(parts)

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        ids: list[int] = []
        offsets: list[tuple[int, int]] = []
        i = 0
        while i < len(text):
            special = next((tid for tid, s in self.SPECIALS.items() if text.startswith(s, i)), None)
            if special is not None:
                end = i + len(self.SPECIALS[special])
                ids.append(special)
                offsets.append((i, end))
                i = end
                continue
            for b in text[i].encode():
                ids.append(b)
                offsets.append((i, i + 1))
            i += 1
        return ids, offsets

    def token_bytes(self, token_id: int) -> bytes:
        if token_id in self.SPECIALS:
            return self.SPECIALS[token_id].encode()
        return bytes([token_id])
