"""Next-token choice from one row of logits: the logits adjusted (repetition, frequency and presence
penalties, logit bias, end tokens held back before min_new_tokens), then greedy, or temperature →
top-k → top-p → min-p sampling with a seeded generator; returns the token, its probability and the
likeliest candidates that were on offer. Without adjustments the logits are the model's, untouched."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from model_runner.protocol.request import SamplingParams

TOP_CANDIDATES = 20  # alternatives a choice carries: the most any request asks (OpenAI's top_logprobs ≤ 20)


@dataclass(frozen=True)
class Choice:
    token_id: int
    prob: float
    candidates: list[tuple[int, float]]  # (token id, probability), most likely first


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    if params.greedy:
        return None
    gen = torch.Generator(device="cpu")  # sample on the CPU: the same seed gives the same text on any device
    gen.manual_seed(params.seed if params.seed is not None else torch.seed() % (2**31))
    return gen


def adjust(
    logits: torch.Tensor,
    params: SamplingParams,
    prompt_ids: Sequence[int] = (),
    output_ids: Sequence[int] = (),
    banned: Sequence[int] = (),
) -> torch.Tensor:
    """The logits [vocab] after the request's penalties and bias, with `banned` ids (end tokens before
    min_new_tokens) made impossible; the same tensor when nothing applies."""
    if not (params.adjusts_logits or banned):
        return logits
    logits = logits.clone()
    vocab = logits.numel()
    if params.repetition_penalty != 1.0 and (prompt_ids or output_ids):
        seen = torch.unique(torch.tensor([*prompt_ids, *output_ids], dtype=torch.long))
        picked = logits[seen]
        # CTRL's rule as transformers and vLLM apply it: a positive logit shrinks, a negative one grows.
        logits[seen] = torch.where(picked > 0, picked / params.repetition_penalty, picked * params.repetition_penalty)
    if (params.frequency_penalty or params.presence_penalty) and output_ids:
        counts = torch.bincount(torch.tensor(output_ids, dtype=torch.long), minlength=vocab)[:vocab].float()
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).float()
    for token, bias in params.logit_bias:
        if token >= vocab:
            raise ValueError(f"logit_bias names token {token}, beyond the vocabulary ({vocab} tokens)")
        logits[token] += bias
    if banned:
        logits[torch.tensor(list(banned), dtype=torch.long)] = float("-inf")
    return logits


def _filter(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    # logits: [vocab] float32
    if params.top_k is not None and params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        remove = cumulative - torch.softmax(sorted_logits, dim=-1) >= params.top_p  # keep the token that crosses p
        logits = logits.masked_fill(remove.scatter(0, order, remove), float("-inf"))
    if params.min_p > 0.0:
        probs = torch.softmax(logits, dim=-1)
        logits = logits.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
    return logits


def choose(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    *,
    prompt_ids: Sequence[int] = (),
    output_ids: Sequence[int] = (),
    banned: Sequence[int] = (),
    candidates: int = TOP_CANDIDATES,
) -> Choice:
    """logits: [vocab] for the last position; the ids so far feed the penalties; `candidates`
    alternatives come back with the choice."""
    logits = adjust(logits.float().cpu(), params, prompt_ids, output_ids, banned)
    if params.greedy:
        probs = torch.softmax(logits, dim=-1)
        token = int(torch.argmax(logits))
    else:
        # Shift by the maximum and divide in float64: with a tiny temperature (as small as 1e-300, which
        # float32 rounds to 0) the result is then 0 and −inf, sampling tends to greedy, never a NaN.
        scaled = ((logits.double() - logits.max()) / params.temperature).float()
        probs = torch.softmax(_filter(scaled, params), dim=-1)
        token = int(torch.multinomial(probs, 1, generator=generator))
    top = torch.topk(probs, min(max(candidates, 1), probs.numel()))
    ranked = [(int(i), float(p)) for p, i in zip(top.values, top.indices)][:candidates]
    return Choice(token, float(probs[token]), ranked)
