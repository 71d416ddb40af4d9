"""`POST /v1/chat/completions`, both ways: an OpenAI chat request → a kvscope `generate` payload
(checked by `parse_generate`, so every limit is the protocol's), and a request's engine events →
a `chat.completion` or its `chat.completion.chunk` stream (docs/protocol.md)."""

from __future__ import annotations

import time
from typing import Any, Iterator

from app.openai.shapes import (
    check_model,
    check_one_choice,
    finish_reason,
    finished_events,
    logprob,
    refuse_unknown,
    rename_field,
    sampling_payload,
    sse,
    sse_stream,
    stream_options,
    usage,
)
from model_runner.errors import UserError
from model_runner.events import Event, Token
from model_runner.request import GenerateParams, json_repr, parse_generate

ROLES = ("system", "user", "assistant")
MAX_TOP_LOGPROBS = 5
KNOWN_FIELDS = (
    "messages",
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "logprobs",
    "top_logprobs",
    "stream",
    "stream_options",
    "n",
    "user",
)


# ---- the request -------------------------------------------------------------------------------


def _messages(raw: Any) -> list[dict]:
    if not isinstance(raw, list):
        raise UserError("`messages` must be a non-empty list of {role, content} objects", field="messages")
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or item.get("role") not in ROLES:
            got = json_repr(item.get("role")) if isinstance(item, dict) else json_repr(item)
            raise UserError(
                f"`messages[{i}].role` must be one of {', '.join(ROLES)}, got {got}", field=f"messages[{i}].role"
            )
        out.append({"role": item["role"], "content": item.get("content")})
    return out


def max_tokens_field(body: dict) -> tuple[str, Any]:
    """The OpenAI name used for the answer's length and its value."""
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return name, body.get(name)


def logprob_options(body: dict) -> int | None:
    """How many top alternatives per token to return, or None when `logprobs` is off."""
    wanted, top = body.get("logprobs", False), body.get("top_logprobs")
    if not isinstance(wanted, bool):
        raise UserError(f"`logprobs` must be true or false, got {json_repr(wanted)}", field="logprobs")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_TOP_LOGPROBS):
        raise UserError(
            f"`top_logprobs` must be an integer between 0 and {MAX_TOP_LOGPROBS}, got {json_repr(top)}",
            field="top_logprobs",
        )
    if top is not None and not wanted:
        raise UserError("`top_logprobs` needs `logprobs` set to true", field="top_logprobs")
    return (top or 0) if wanted else None


def to_generate(body: dict, ids: list[str]) -> dict[str, Any]:
    """The kvscope `generate` payload for an OpenAI chat request (checked by parse_generate next)."""
    refuse_unknown(body, KNOWN_FIELDS)
    check_one_choice(body)
    check_model(body, ids)
    return {"messages": _messages(body.get("messages")), **sampling_payload(body, max_tokens_field(body)[1])}


def parse_chat(body: Any, ids: list[str]) -> tuple[GenerateParams, int | None, bool, bool]:
    """(GenerateParams, top_logprobs or None, stream, include_usage); UserError naming the OpenAI field."""
    if not isinstance(body, dict):
        raise UserError("the request body must be a JSON object", field=None)
    try:
        top = logprob_options(body)
        stream, include_usage = stream_options(body)
        params = parse_generate(to_generate(body, ids))
    except UserError as exc:
        raise rename_field(exc, {"max_new_tokens": max_tokens_field(body)[0]}) from None
    return params, top, stream, include_usage


# ---- the answer --------------------------------------------------------------------------------


def logprob_entry(token: Token, top: int) -> dict[str, Any]:
    return {
        "token": token.text,
        "logprob": logprob(token.prob),
        "bytes": list(token.text.encode()),
        "top_logprobs": [
            {"token": c.text, "logprob": logprob(c.prob), "bytes": list(c.text.encode())}
            for c in token.candidates[:top]
        ],
    }


def completion(rid: str, served: str, events: list[Event], top: int | None) -> dict[str, Any]:
    """The `chat.completion` object for a finished request's events."""
    accepted, finished = finished_events(events)
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": finished.text},
        "finish_reason": finish_reason(finished),
        "logprobs": None,
    }
    if top is not None:
        choice["logprobs"] = {"content": [logprob_entry(e, top) for e in events if isinstance(e, Token)]}
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": served,
        "choices": [choice],
        "usage": usage(accepted, finished),
    }


def chunk(rid: str, served: str, delta: dict, finish: str | None = None, logprobs=None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": served,
        "choices": [choice],
    }


def chunks(rid: str, served: str, events: Iterator[Event], top: int | None, include_usage: bool) -> Iterator[str]:
    """Server-sent `chat.completion.chunk`s for one request's engine events: the role first."""
    yield sse(chunk(rid, served, {"role": "assistant", "content": ""}))
    yield from sse_stream(
        events,
        top,
        include_usage,
        token_object=lambda token: chunk(
            rid,
            served,
            {"content": token.text},
            logprobs={"content": [logprob_entry(token, top)]} if top is not None else None,
        ),
        finish_object=lambda finished: chunk(rid, served, {}, finish_reason(finished)),
        usage_object={**chunk(rid, served, {}), "choices": []},
    )
