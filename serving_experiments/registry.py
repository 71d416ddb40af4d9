"""The registry of the serving chapter's experiments: each one's name (its URL), title, parameters and
run function, and whether it sets a scheduling policy for its duration (refused where policy changes are)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from model_runner.protocol.errors import UserError
from serving_experiments.experiments import (
    attention_cost,
    batch_invariance,
    batching,
    chunked_prefill,
    paged_blocks,
    prefix_caching,
    pricing,
    speculative,
    why_batch,
)
from serving_experiments.harness import Param


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    params: dict[str, Param]
    run: Callable[..., dict]
    needs_policy: bool  # sets a scheduling policy for its duration (only where policy changes are allowed)


EXPERIMENTS = {
    e.name: e
    for e in (
        Experiment("why_batch", "Why batch: one step's cost against batch size", why_batch.PARAMS, why_batch.run, True),
        Experiment("batching", "Static against continuous batching", batching.PARAMS, batching.run, True),
        Experiment("paged_blocks", "Paged KV blocks", paged_blocks.PARAMS, paged_blocks.run, False),
        Experiment("chunked_prefill", "Chunked prefill", chunked_prefill.PARAMS, chunked_prefill.run, True),
        Experiment("prefix_caching", "Prefix caching", prefix_caching.PARAMS, prefix_caching.run, True),
        Experiment(
            "attention_cost",
            "Attention is not free: decode step time against cached positions",
            attention_cost.PARAMS,
            attention_cost.run,
            True,  # prefix caching on for its run, so each longer prompt reuses the shorter one's blocks
        ),
        Experiment("speculative", "Speculative decoding", speculative.PARAMS, speculative.run, False),
        Experiment("pricing", "Prefill against decode: the price of a token", pricing.PARAMS, pricing.run, False),
        Experiment(
            "batch_invariance",
            "Why the same prompt can answer differently",
            batch_invariance.PARAMS,
            batch_invariance.run,
            True,  # switches batch-invariant mode (and prefix caching off) for its run
        ),
    )
}


def experiment(name: str) -> Experiment:
    if name not in EXPERIMENTS:
        raise UserError(
            f"no experiment named `{name[:40]}`; known: {', '.join(EXPERIMENTS)}", code="not_found", field="name"
        )
    return EXPERIMENTS[name]
