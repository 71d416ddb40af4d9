"""What chat and legacy completions share in the OpenAI-compatible API (docs/protocol.md,
"OpenAI-compatible API"): the check of the model id a client sends (the ids are app/model_names.py's),
and the pieces of every answer (finish reason, usage, token names and log-probabilities, server-sent
events); the request fields they share are app/openai/request_fields.py's."""

from __future__ import annotations

import json
import math
from typing import Any

from app.outcomes import FINISH_REASONS
from model_runner.protocol.errors import UserError
from model_runner.protocol.events import Accepted, Event, Finished, Token
from model_runner.protocol.request import json_repr

# ---- model ids ---------------------------------------------------------------------------------


def check_model(body: dict, ids: list[str]) -> None:
    """An unknown `model` is OpenAI's 404 `model_not_found`; an absent one means the served model."""
    model = body.get("model")
    if model is not None and model not in ids:
        raise UserError(
            f"the model {json_repr(model)} does not exist here; this server runs {', '.join(map(repr, ids))}",
            code="model_not_found",
            field="model",
        )


# ---- answers -----------------------------------------------------------------------------------


def logprob(prob: float) -> float:
    return math.log(prob) if prob > 0 else -9999.0


class TokenNames:
    """One name per token id wherever it appears (the chosen token, an alternative, a prompt token): its
    own bytes shown on their own, so an end token reads `<|im_end|>` both as chosen and as alternative.
    Without the tokenizer (a remote engine) the candidates' texts name what they can."""

    def __init__(self, tokenizer=None):
        self.tokenizer = tokenizer

    def name(self, token_id: int, fallback: str = "") -> str:
        if self.tokenizer is None:
            return fallback
        return self.tokenizer.token_bytes(token_id).decode("utf-8", errors="backslashreplace")

    def raw(self, token_id: int, fallback: str = "") -> bytes:
        return self.tokenizer.token_bytes(token_id) if self.tokenizer is not None else fallback.encode()

    def of(self, token: Token) -> str:
        """A generated token's name: from the tokenizer, else the candidate with its id, else its text."""
        named = next((c.text for c in token.candidates if c.id == token.id), token.text)
        return self.name(token.id, named)


def finish_reason(event: Finished) -> str:
    return FINISH_REASONS.get(event.reason, "length")


def usage_of(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def usage(accepted: Accepted | None, finished: Finished) -> dict[str, int]:
    return usage_of(accepted.prompt_tokens if accepted is not None else 0, finished.tokens)


def terminal_error(event: Event) -> UserError:
    """A UserError for a request that ended without finishing (an engine error or a cancel)."""
    d = event.to_dict()
    if d["type"] == "error":
        return UserError(d["message"], code=d["code"], field=d.get("field"))
    return UserError(f"the request was cancelled ({d['cause']})", code="cancelled")


def finished_events(events: list[Event]) -> tuple[Accepted | None, Finished]:
    """A finished request's `accepted` and `finished` events; a request that ended otherwise raises
    its error (answered in OpenAI's shape)."""
    accepted = next((e for e in events if isinstance(e, Accepted)), None)
    if not isinstance(events[-1], Finished):
        raise terminal_error(events[-1])
    return accepted, events[-1]


def sse(data: Any) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"
