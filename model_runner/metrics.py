"""A request's timing metrics, computed in one place from its clock stamps. Definitions (as in
vLLM's): queue = submit → prefill start; prefill = prefill start → first token; TTFT = submit →
first token; TPOT = (E2E − TTFT) / (tokens − 1); ITL = the gaps between consecutive tokens."""

from __future__ import annotations

from typing import Any

from .sequence import Sequence


def request_metrics(seq: Sequence, end: float) -> dict[str, Any]:
    def ms(t: float | None) -> float | None:
        return None if t is None else round((t - seq.submitted_at) * 1000, 3)

    times = seq.token_times
    n = len(times)
    e2e = ms(end)
    ttft = ms(times[0]) if times else None
    decode_s = times[-1] - times[0] if n > 1 else 0.0
    buffered = seq.params.delivery == "buffered"
    return {
        "queue_ms": ms(seq.prefill_start) if seq.prefill_start is not None else e2e,
        "prefill_ms": round((times[0] - seq.prefill_start) * 1000, 3) if times else None,
        "ttft_ms": ttft,
        "tpot_ms": round((e2e - ttft) / (n - 1), 3) if n > 1 else None,
        "e2e_ms": e2e,
        "decode_tokens_per_s": round((n - 1) / decode_s, 3) if decode_s > 0 else None,
        "first_text_ms": e2e if buffered and seq.released_text else ms(seq.first_text_at),
        "itl_ms": [round((b - a) * 1000, 3) for a, b in zip(times, times[1:])],
    }
