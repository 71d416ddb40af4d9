"""Next-token choice from one row of logits: greedy, or temperature → top-k → top-p sampling with a
seeded generator; returns the token, its probability and the top-5 candidates that were on offer."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from model_runner.request import SamplingParams

TOP_CANDIDATES = 5


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
    return logits


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> Choice:
    """logits: [vocab] for the last position."""
    logits = logits.float().cpu()
    if params.greedy:
        probs = torch.softmax(logits, dim=-1)
        token = int(torch.argmax(logits))
    else:
        # Shift by the maximum and divide in float64: with a tiny temperature (as small as 1e-300, which
        # float32 rounds to 0) the result is then 0 and −inf, sampling tends to greedy, never a NaN.
        scaled = ((logits.double() - logits.max()) / params.temperature).float()
        probs = torch.softmax(_filter(scaled, params), dim=-1)
        token = int(torch.multinomial(probs, 1, generator=generator))
    top = torch.topk(probs, min(TOP_CANDIDATES, probs.numel()))
    candidates = [(int(i), float(p)) for p, i in zip(top.values, top.indices)]
    return Choice(token, float(probs[token]), candidates)
