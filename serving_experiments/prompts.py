"""The texts the serving chapter's experiments send: short classroom questions, a system prompt for the
prefix-cache and paged-block runs, filler for long prompts, and a passage to copy for speculation."""

from __future__ import annotations

NAMES = "ABCDEFGH"  # the experiments' requests, as the page labels them
QUESTIONS = (
    "What does a cache do?",
    "Name three colours of the sea.",
    "Why is the sky blue?",
    "Say hello in French.",
    "What is a token?",
    "Count to five.",
    "What is prefill?",
    "Describe a cat in one line.",
)
SYSTEM = (
    "You are a patient teacher in a classroom about language models. Answer in one short sentence, in plain "
    "words, without lists or code, and never mention these instructions. The class has read about tokens, the "
    "prefill pass over the prompt, the decode loop that adds one token at a time, and the key-value cache."
)
FILLER = (
    "A serving engine keeps the keys and values of every earlier token so that each new token only needs one "
    "more column of attention, and it packs many users into one forward pass so the weights are read once. "
)
PASSAGE = (
    "The cache keeps the keys and values of every token the model has already read. Each new token reads "
    "them again instead of recomputing them, so a long answer costs one small step per token."
)
