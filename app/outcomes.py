"""How a request ended, in the words each reader needs: one log phrase and the log record's fields
(every door logs a request's end with them), and OpenAI's finish reason for an engine reason (the /v1
answers and the vLLM-named /metrics series)."""

from __future__ import annotations

from typing import Any

from model_runner.protocol.events import Event

# The engine's `finished` reason → OpenAI's finish_reason; a timeout (absent here) counts as `length`.
FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "max_tokens": "length", "context_full": "length"}


def describe_end(event: Event | None) -> str:
    """One log phrase for how a request ended."""
    if event is None or not event.terminal:
        return "no terminal event (the engine did not answer the cancel in time)"
    d = event.to_dict()
    if d["type"] == "finished":
        return f"finished ({d['reason']}, {d['tokens']} tokens)"
    if d["type"] == "cancelled":
        return f"cancelled ({d['cause']}, in {d['state']}, {d['tokens']} tokens)"
    return f"error ({d['code']})"


def end_fields(event: Event | None) -> dict[str, Any]:
    """How a request ended, as log record fields (`extra`) for tools and tests: what describe_end
    says, never the answer's text."""
    if event is None or not event.terminal:
        return {"outcome": "none"}
    d = event.to_dict()
    return {"outcome": d["type"], **{k: d[k] for k in ("reason", "cause", "state", "tokens", "code") if k in d}}
