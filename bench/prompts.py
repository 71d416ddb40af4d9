"""Deterministic prompts of a given token length: the longest prefix of kvscope's own text whose
chat-templated token count fits the target, as the engine itself counts it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from model_runner.errors import UserError
from model_runner.request import parse_generate

# Deterministic prompt text (kvscope's own words): an instruction that invites a long answer, then
# notes cycled as needed. A prompt of N tokens is the longest prefix of this that fits in N.
INSTRUCTION = "Write a long, detailed essay that explains the following notes, point by point."
NOTES = (
    "A language model reads the whole prompt in one pass, called prefill, and stores a key and a value "
    "for every token in every layer. Then it writes the answer one token at a time; each new token "
    "attends to everything stored so far, so the cache grows by one position per step. Prefill is limited "
    "by arithmetic, because many tokens share each weight read, while decoding is limited by memory, "
    "because every step reads all the weights to produce a single token. Queues form when more people "
    "ask than the model can serve, and the waiting shows up as time to first token. Streaming sends each "
    "piece of text as soon as it is ready, so a reader sees progress long before the answer is complete."
).split()


@dataclass(frozen=True)
class Prompt:
    target: int
    messages: list[dict[str, str]]
    ids: list[int]

    @property
    def tokens(self) -> int:
        return len(self.ids)


VARIANT_STRIDE = 11  # words the notes move on per prompt variant, so variants differ early


def prompt_text(words: int, variant: int = 0, suffix: str = "") -> str:
    """The first `words` words of the instruction followed by the notes, cycled (from word
    variant x VARIANT_STRIDE of the notes, so each variant is a different prompt), then `suffix`."""
    start = variant * VARIANT_STRIDE
    pool = INSTRUCTION.split() + [NOTES[(start + i) % len(NOTES)] for i in range(max(0, words))]
    return " ".join(pool[: max(1, words)]) + (f" {suffix}" if suffix else "")


def fit_prompt(describe: Callable[[Any], dict], target: int, variant: int = 0, suffix: str = "") -> Prompt:
    """The longest prompt (template included) of at most `target` tokens; the shortest one when even
    one word is over. Binary search over the word count: tokens only grow as words are added.
    Prompts with the same variant and different suffixes share their beginning (a common document
    with different questions after it)."""

    def tokens(words: int) -> tuple[int, list[int]] | None:
        messages = [{"role": "user", "content": prompt_text(words, variant, suffix)}]
        try:
            view = describe(parse_generate({"messages": messages, "max_new_tokens": 1}))
        except UserError:  # longer than the content limit or the context window
            return None
        return view["counts"]["total"], [t["id"] for t in view["tokens"]]

    low, high = 1, 2
    while (count := tokens(high)) is not None and count[0] <= target:
        low, high = high, high * 2
    while high - low > 1:  # invariant: low fits (or is the minimum), high does not
        mid = (low + high) // 2
        count = tokens(mid)
        low, high = (mid, high) if count is not None and count[0] <= target else (low, mid)
    fitted = tokens(low)
    if fitted is None:
        raise UserError("not even a one-word prompt fits this model's context window", field="prompt_lens")
    return Prompt(target, [{"role": "user", "content": prompt_text(low, variant, suffix)}], fitted[1])
