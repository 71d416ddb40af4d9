"""Greedy speculative decoding on a loaded model, outside the engine's batch: a proposer guesses k
tokens (prompt lookup: the continuation of the latest earlier match of the last n tokens; or a draft
model), the target model checks them in ONE forward over [last token + k guesses] with a DynamicCache,
the longest prefix equal to its own argmax is kept, and its own next token follows (the bonus). The
output is exactly plain greedy decoding's; each step reports what was proposed, accepted and added."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from model_runner.local.step.forward import steer

MAX_NGRAM = 3  # longest suffix matched by prompt lookup (vLLM's prompt_lookup_max default is 5; short prompts here)
PROPOSE = 4  # tokens proposed per step


class Proposer(Protocol):
    name: str

    def propose(self, tokens: list[int], k: int) -> list[int]: ...


class PromptLookup:
    """Prompt lookup (n-gram) decoding: find the latest earlier place where the last n tokens (n from
    `max_ngram` down to 1) occurred, and propose the k tokens that followed it there."""

    name = "prompt lookup (n-gram)"

    def __init__(self, max_ngram: int = MAX_NGRAM):
        self.max_ngram = max_ngram

    def propose(self, tokens: list[int], k: int) -> list[int]:
        for n in range(min(self.max_ngram, len(tokens) - 1), 0, -1):
            suffix = tokens[-n:]
            # latest match first: a passage being rewritten is usually copied from where it was left
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start : start + n] == suffix:
                    return tokens[start + n : start + n + k]
        return []


class DraftModel:
    """A small model with the same vocabulary proposes k tokens by its own greedy decoding."""

    def __init__(self, model, name: str):
        self.model, self.name = model, f"draft model {name}"

    def propose(self, tokens: list[int], k: int) -> list[int]:
        from transformers import DynamicCache

        out: list[int] = []
        cache = DynamicCache(config=self.model.config)
        ids = torch.tensor([tokens], dtype=torch.long, device=self.model.device)  # [1, tokens]
        for _ in range(k):
            logits = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
            token = int(steer(self.model, [tokens + out], logits[0, -1:])[0].argmax())
            out.append(token)
            ids = torch.tensor([[token]], dtype=torch.long, device=self.model.device)  # [1, 1]
        return out


@dataclass
class SpecStep:
    proposed: list[int]
    accepted: int  # leading proposals equal to the model's own argmax, kept
    rejected: int  # proposals after the first mismatch (or cut by the token limit), thrown away
    bonus: int | None  # the model's own token after the accepted ones; None when the limit or an end came first

    @property
    def produced(self) -> int:
        return self.accepted + (self.bonus is not None)


@dataclass
class SpecRun:
    token_ids: list[int] = field(default_factory=list)
    steps: list[SpecStep] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def proposed(self) -> int:
        return sum(len(s.proposed) for s in self.steps)

    @property
    def accepted(self) -> int:
        return sum(s.accepted for s in self.steps)


def _argmax_rows(model, histories: list[list[int]], logits: torch.Tensor) -> list[int]:
    """logits [rows, vocab], row i after histories[i] → each row's greedy token."""
    return steer(model, histories, logits).argmax(dim=-1).tolist()


def plain_greedy(model, prompt_ids: list[int], max_new_tokens: int, eos_ids: frozenset[int]) -> SpecRun:
    """The reference: prefill, then one forward + argmax per token, stopping after an end token."""
    from transformers import DynamicCache

    run = SpecRun()
    t0 = time.perf_counter()
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=model.device)  # [1, prompt]
        while True:
            logits = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
            token = _argmax_rows(model, [prompt_ids + run.token_ids], logits[0, -1:])[0]
            run.token_ids.append(token)
            run.steps.append(SpecStep([], 0, 0, token))
            if token in eos_ids or len(run.token_ids) >= max_new_tokens:
                break
            ids = torch.tensor([[token]], dtype=torch.long, device=model.device)  # [1, 1]
    run.seconds = time.perf_counter() - t0
    return run


def speculative_greedy(
    model,
    prompt_ids: list[int],
    max_new_tokens: int,
    eos_ids: frozenset[int],
    proposer: Proposer,
    k: int = PROPOSE,
    on_step: Callable[[SpecStep], None] | None = None,
) -> SpecRun:
    """Greedy decoding with speculation; the first step is the prefill (nothing proposed, its token a bonus)."""
    from transformers import DynamicCache

    run = SpecRun()
    t0 = time.perf_counter()
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=model.device)  # [1, prompt]
        logits = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        first = _argmax_rows(model, [prompt_ids], logits[0, -1:])[0]
        _record(run, SpecStep([], 0, 0, first), on_step)
        while run.token_ids[-1] not in eos_ids and len(run.token_ids) < max_new_tokens:
            _record(
                run, _verify(model, cache, prompt_ids, run.token_ids, max_new_tokens, eos_ids, proposer, k), on_step
            )
    run.seconds = time.perf_counter() - t0
    return run


def _record(run: SpecRun, step: SpecStep, on_step) -> None:
    run.steps.append(step)
    run.token_ids += step.proposed[: step.accepted] + ([step.bonus] if step.bonus is not None else [])
    if on_step is not None:
        on_step(step)


def _verify(model, cache, prompt_ids, out, max_new_tokens, eos_ids, proposer, k) -> SpecStep:
    """One speculative step. The cache holds prompt + out[:-1]; afterwards it holds prompt + the
    tokens this step keeps except the last one (which the next step feeds in)."""
    history = prompt_ids + out
    room = max_new_tokens - len(out)  # tokens this step may still add
    proposed = proposer.propose(history, min(k, room))[: min(k, room)]
    ids = torch.tensor([[out[-1], *proposed]], dtype=torch.long, device=model.device)  # [1, 1 + k]
    logits = model(input_ids=ids, past_key_values=cache, use_cache=True).logits[0]  # [1 + k, vocab]
    preds = _argmax_rows(model, [history + proposed[:i] for i in range(len(proposed) + 1)], logits)
    accepted = 0
    while accepted < len(proposed) and proposed[accepted] == preds[accepted]:
        accepted += 1
        if proposed[accepted - 1] in eos_ids:  # greedy would stop at this end token: nothing after it counts
            break
    ended = accepted and proposed[accepted - 1] in eos_ids
    bonus = None if ended or accepted >= room else preds[accepted]
    # keep the fed-in last token and the accepted proposals (transformers 5: crop(-n) drops the last n)
    cache.crop(-(len(proposed) - accepted))
    return SpecStep(proposed, accepted, len(proposed) - accepted, bonus)
