"""Running the model for one engine step: the batched forward over the paged pool for the step's
work (decode tokens and prefill chunks) plus a plain recompute for cache-free requests, one logits
row per request that wants a token. When the batched forward fails, each request runs alone, so
only those that fail on their own are reported; the caller ends them."""

from __future__ import annotations

import logging
import traceback
from dataclasses import dataclass, field
from typing import Callable

import torch

from model_runner.loading.loader import LoadedModel
from model_runner.local.forward import recompute_forward
from model_runner.local.kv_cache import PagedKVPool
from model_runner.local.scheduler import StepPlan, Work
from model_runner.shared.sequence import Sequence

log = logging.getLogger("kvscope.engine")

Forward = Callable[[list[Work]], torch.Tensor]  # the batched forward: [rows that want logits, vocab]


@dataclass
class StepOutput:
    logits: dict[int, torch.Tensor] = field(default_factory=dict)  # id(work) → logits row [vocab]
    failures: dict[Sequence, Exception] = field(default_factory=dict)  # requests whose forward failed alone


def run_step(batch: StepPlan, forward: Forward, loaded: LoadedModel, pool: PagedKVPool) -> StepOutput:
    """The step's forward passes; a failed batch is undone and retried request by request."""
    cached = {id(w): w.seq.cached for w in batch.work}  # to undo a failed step's bookkeeping
    try:
        return StepOutput(logits=_run(batch, forward, loaded, pool))
    except Exception as exc:
        for work in batch.work:
            work.seq.cached = cached[id(work)]
        return _isolate_failure(batch, exc, forward, loaded, pool)


def _run(batch: StepPlan, forward: Forward, loaded: LoadedModel, pool: PagedKVPool) -> dict[int, torch.Tensor]:
    rows: dict[int, torch.Tensor] = {}
    if batch.work:
        completing = pool.completing_step([(w.seq, len(w.tokens)) for w in batch.work])
        logits = forward(batch.work)  # [wanting rows, vocab]
        pool.completed_step([w.seq for w in batch.work], completing)
        wanting = [w for w in batch.work if w.wants_logits]
        rows.update({id(w): logits[i] for i, w in enumerate(wanting)})
    for work in batch.recompute:
        rows[id(work)] = recompute_forward(loaded.model, work.seq)[0]
    _sync(loaded.facts.device)
    return rows


def _isolate_failure(
    batch: StepPlan, exc: Exception, forward: Forward, loaded: LoadedModel, pool: PagedKVPool
) -> StepOutput:
    """A batched forward failed: run each request of the step alone, so only the ones that fail
    on their own end with an error and the others carry on (the worker lives on either way)."""
    log.error("model step failed: %s", exc)
    log.debug("%s", traceback.format_exc())
    alone = [StepPlan(work=[w]) for w in batch.work] + [StepPlan(recompute=[w]) for w in batch.recompute]
    out = StepOutput()
    for single in alone:
        seq = (single.work + single.recompute)[0].seq
        cached = seq.cached
        try:
            if len(alone) == 1:
                raise exc
            out.logits.update(_run(single, forward, loaded, pool))
        except Exception as failure:
            seq.cached = cached
            out.failures[seq] = failure
    return out


def _sync(device: str) -> None:
    """Wait for the device, so the step's time is the model's work and not only its launch."""
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()
