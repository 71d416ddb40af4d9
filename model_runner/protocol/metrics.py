"""A request's timing metrics, computed in one place from its clock stamps (time.monotonic, read by
the engine). Where each clock starts and stops (docs/protocol.md, "Timing metrics"):

- submit: `Sequence.submitted_at`, stamped when `Engine.submit` builds the request, i.e. *after* the
  chat template was rendered, the prompt tokenized and the context budget decided (vLLM's clocks
  start at arrival, before that work);
- prefill start: `Sequence.prefill_start`, stamped once when the scheduler first admits the request,
  before its per-request set-up (detokenizer, stop checker, sampler);
- first token: the end of the step whose forward produced the first token (`token_times[0]`).

queue = submit → prefill start; prefill = prefill start → first token (set-up, any waiting between
prefill chunks or after a preemption, and the forward passes); TTFT = submit → first token, so
queue + prefill = TTFT exactly (prefill is computed as TTFT − queue from the rounded figures);
TPOT = (E2E − TTFT) / (tokens − 1); ITL = the gaps between consecutive tokens."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # only read here: the ground floor imports nothing above it
    from model_runner.shared.sequence import Sequence


def request_metrics(seq: Sequence, end: float) -> dict[str, Any]:
    def ms(t: float | None) -> float | None:
        return None if t is None else round((t - seq.submitted_at) * 1000, 3)

    times = seq.token_times
    n = len(times)
    e2e = ms(end)
    ttft = ms(times[0]) if times else None
    queue = ms(seq.prefill_start) if seq.prefill_start is not None else e2e
    decode_s = times[-1] - times[0] if n > 1 else 0.0
    buffered = seq.params.delivery == "buffered"
    return {
        "queue_ms": queue,
        "prefill_ms": round(ttft - queue, 3) if times else None,
        "ttft_ms": ttft,
        "tpot_ms": round((e2e - ttft) / (n - 1), 3) if n > 1 else None,
        "e2e_ms": e2e,
        "decode_tokens_per_s": round((n - 1) / decode_s, 3) if decode_s > 0 else None,
        "first_text_ms": e2e if buffered and seq.released_text else ms(seq.first_text_at),
        "itl_ms": [round((b - a) * 1000, 3) for a, b in zip(times, times[1:])],
    }


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between order statistics (numpy's default); None for no values.
    The one definition: the class stats, the bench and the serving chapter's experiments all call it."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def p50_p95(values: list[float | None]) -> dict[str, float | None]:
    """Median and 95th percentile of the values that are known, rounded to 0.001 ms, and how many."""
    kept = [v for v in values if v is not None]
    return {
        "p50": None if not kept else round(percentile(kept, 50), 3),
        "p95": None if not kept else round(percentile(kept, 95), 3),
        "n": len(kept),
    }
