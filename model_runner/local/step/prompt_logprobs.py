"""A prompt's per-position log-probabilities from its own prefill (OpenAI's `echo` with `logprobs`):
for the prefill rows of requests that ask (`prompt_logprobs`), the batched forward keeps the logits of
every position, not only the last; position p's log-softmax scores the prompt's token p + 1. Rows
that do not ask cost nothing: the step keeps one position each, as before. Positions a prefix-cache
hit skipped are computed by one cache-free forward over that prefix."""

from __future__ import annotations

import torch

from model_runner.local.scheduler import Work
from model_runner.shared.sequence import Sequence

SOFTMAX_ROWS = 1024  # positions per log-softmax: bounds the float32 copies a long prompt makes


def asks(row: Work) -> bool:
    """A prompt row (a whole prompt or a chunk) of a request that wants its prompt's logprobs, the
    first time it runs (a preempted request's recompute has them already)."""
    return row.kind == "prefill" and row.seq.params.prompt_logprobs is not None and not row.seq.output_ids


def kept_positions(rows: list[Work], cu_q: list[int]) -> tuple[list[int], list[int], list[tuple[Work, int, int]]]:
    """(positions of the step's flat tokens whose logits the model returns, where in those the rows that
    want a token find theirs, (row, first, end) in the kept positions of each asking row)."""
    keep: list[int] = []
    wanted: list[int] = []
    spans: list[tuple[Work, int, int]] = []
    for row, start, end in zip(rows, cu_q, cu_q[1:]):
        if asks(row):
            spans.append((row, len(keep), len(keep) + end - start))
            keep += range(start, end)
        elif row.wants_logits:
            keep.append(end - 1)
        if row.wants_logits:
            wanted.append(len(keep) - 1)
    return keep, wanted, spans


def score(logits: torch.Tensor, next_ids: list[int], top: int) -> list[tuple[float, list[tuple[int, float]]]]:
    """logits [positions, vocab] → per position, the log-probability of `next_ids[i]` and the `top`
    likeliest (id, log-probability), in float32, on the device, a bounded block at a time."""
    out = []
    targets = torch.tensor(next_ids, dtype=torch.long, device=logits.device)
    for first in range(0, len(next_ids), SOFTMAX_ROWS):
        block = torch.log_softmax(logits[first : first + SOFTMAX_ROWS].float(), dim=-1)
        chosen = block.gather(1, targets[first : first + SOFTMAX_ROWS, None])[:, 0].cpu().tolist()
        values, ids = torch.topk(block, top, dim=-1) if top else (block[:, :0], block[:, :0].long())
        for lp, vs, js in zip(chosen, values.cpu().tolist(), ids.cpu().tolist()):
            out.append((lp, list(zip(js, vs))))
    return out


def record(seq: Sequence, first_position: int, logits: torch.Tensor) -> None:
    """Store what positions first_position … first_position + len(logits) − 1 say about the prompt's
    next tokens (the prompt's last position scores the answer's first token: the sampler's business)."""
    prompt = seq.prompt_ids
    if seq.prompt_logprobs is None:
        seq.prompt_logprobs = [None] * len(prompt)
    count = min(len(logits), len(prompt) - 1 - first_position)  # positions whose next token is the prompt's
    if count <= 0:
        return
    scored = score(logits[:count], prompt[first_position + 1 : first_position + 1 + count], seq.params.prompt_logprobs)
    seq.prompt_logprobs[first_position + 1 : first_position + 1 + count] = scored


def fill_skipped_prefix(model, seq: Sequence) -> None:
    """A prefix-cache hit left positions 0 … seq.cached − 1 uncomputed: one cache-free forward over them."""
    if seq.cached == 0 or (seq.prompt_logprobs is not None and seq.prompt_logprobs[seq.cached] is not None):
        return
    ids = torch.tensor([seq.prompt_ids[: seq.cached]], dtype=torch.long, device=model.device)
    record(seq, 0, model(input_ids=ids, use_cache=False).logits[0])
