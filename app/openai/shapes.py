"""What chat and legacy completions share in the OpenAI-compatible API (docs/protocol.md,
"OpenAI-compatible API"): the model ids a client may send, and the pieces of every answer (finish
reason, usage, token names and log-probabilities, server-sent events); the request fields they share
are app/openai/request_fields.py's."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from app.api import public_source
from model_runner.errors import UserError
from model_runner.events import Accepted, Event, Finished, Token
from model_runner.request import json_repr

FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "max_tokens": "length", "context_full": "length"}
TYPABLE = re.compile(r"^[\w.:/@+-]+$")  # an id a client can type: no spaces, no parentheses
UNLOADED = "kvscope"  # the id before the model's facts are known


# ---- model ids ---------------------------------------------------------------------------------


def own_model_id(facts) -> str:
    """The model's own name as a client would type it: its source when that is an id (a hub id, a
    folder name, `fake`, the remote's id), else its name without how it runs
    ("SmolLM2-135M-Instruct (Q4_1 GGUF)" → "SmolLM2-135M-Instruct")."""
    if facts is None:
        return UNLOADED
    source = public_source(facts.source or facts.name) or ""
    if TYPABLE.match(source):
        return source
    name = (public_source(facts.name) or "").split(" (")[0].strip()
    return name if TYPABLE.match(name) else re.sub(r"[^\w.:/@+-]+", "-", name).strip("-") or UNLOADED


def model_ids(facts, served_names: str | list[str] | tuple[str, ...] = ()) -> list[str]:
    """Every id this server answers to: the `--served-model-name` names (the first is the one it
    reports, as vLLM's `model_name`), then the model's own name. One name may come as a plain
    string (KVSCOPE_SERVED_MODEL_NAMES=tiny-chat, which is not JSON)."""
    names = [served_names] if isinstance(served_names, str) else list(served_names or ())
    ids = [str(name) for name in names]
    own = own_model_id(facts)
    return ids + [own] if own not in ids else ids


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
