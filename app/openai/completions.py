"""`POST /v1/completions`, OpenAI's legacy text completion, both ways: the request → a kvscope
`generate` payload whose prompt is the raw text (no chat template; checked by `parse_generate`, so
every limit is the protocol's), and a request's engine events → a `text_completion` or its stream
(docs/protocol.md, "POST /v1/completions")."""

from __future__ import annotations

import dataclasses
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
    sse_stream,
    stream_options,
    usage,
)
from model_runner.errors import UserError
from model_runner.events import Event, Token
from model_runner.fields import json_repr
from model_runner.request import GenerateParams, parse_generate

MAX_LOGPROBS = 5
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this endpoint (chat's is the protocol's 128)
KNOWN_FIELDS = (
    "prompt",
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "logprobs",
    "echo",
    "stream",
    "stream_options",
    "n",
    "user",
)
# parse_generate's field names for the one message → `prompt`, the field the client sent.
PROMPT_FIELDS = {"messages": "prompt", "messages[0]": "prompt", "messages[0].content": "prompt"}


# ---- the request -------------------------------------------------------------------------------


def prompt_text(raw: Any) -> str:
    """A string, or a list holding one string (as OpenAI's client sends a batch of one)."""
    if isinstance(raw, list) and len(raw) == 1:
        raw = raw[0]
    if not isinstance(raw, str):
        raise UserError(
            f"`prompt` must be a string or a list of one string (no token ids, no batches), got {json_repr(raw)}",
            field="prompt",
        )
    if not raw.strip():
        raise UserError("`prompt` must hold some text", field="prompt")
    return raw


def logprobs_option(body: dict) -> int | None:
    """How many top alternatives per token to return (0–5), or None when `logprobs` is absent."""
    value = body.get("logprobs")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_LOGPROBS:
        raise UserError(
            f"`logprobs` must be an integer between 0 and {MAX_LOGPROBS}, got {json_repr(value)}", field="logprobs"
        )
    return value


def check_echo(body: dict) -> None:
    echo = body.get("echo", False)
    if echo is not False and echo is not None:
        raise UserError(
            f"`echo` must be false: the answer holds the generated text only, got {json_repr(echo)}", field="echo"
        )


def to_generate(body: dict, ids: list[str]) -> dict[str, Any]:
    """The kvscope `generate` payload for a completion request (checked by parse_generate next)."""
    refuse_unknown(body, KNOWN_FIELDS)
    check_one_choice(body)
    check_model(body, ids)
    check_echo(body)
    message = {"role": "user", "content": prompt_text(body.get("prompt"))}
    return {"messages": [message], **sampling_payload(body, body.get("max_tokens"), DEFAULT_MAX_TOKENS)}


def parse_completion(body: Any, ids: list[str]) -> tuple[GenerateParams, int | None, bool, bool]:
    """(GenerateParams with the raw prompt, logprobs or None, stream, include_usage); UserError
    naming the OpenAI field."""
    if not isinstance(body, dict):
        raise UserError("the request body must be a JSON object", field=None)
    try:
        top = logprobs_option(body)
        stream, include_usage = stream_options(body)
        params = parse_generate(to_generate(body, ids))
    except UserError as exc:
        raise rename_field(exc, {"max_new_tokens": "max_tokens", **PROMPT_FIELDS}) from None
    return dataclasses.replace(params, chat_template=False), top, stream, include_usage


# ---- the answer --------------------------------------------------------------------------------


def legacy_logprobs(tokens: list[Token], top: int, offset: int = 0) -> dict[str, list]:
    """OpenAI's legacy logprobs object: each token, its logprob, the `top` likeliest alternatives
    (with the chosen token always among them, as OpenAI's), and its offset in the text."""
    out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token in tokens:
        alternatives = {c.text: logprob(c.prob) for c in token.candidates[:top]}
        alternatives.setdefault(token.text, logprob(token.prob))
        out["tokens"].append(token.text)
        out["token_logprobs"].append(logprob(token.prob))
        out["top_logprobs"].append(alternatives)
        out["text_offset"].append(offset)
        offset += len(token.text)
    return out


def _choice(text: str, finish: str | None, logprobs: dict | None) -> dict[str, Any]:
    return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}


def _object(rid: str, served: str, choices: list[dict]) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": served, "choices": choices}


def completion(rid: str, served: str, events: list[Event], top: int | None) -> dict[str, Any]:
    """The `text_completion` object for a finished request's events."""
    accepted, finished = finished_events(events)
    tokens = [e for e in events if isinstance(e, Token)]
    logprobs = legacy_logprobs(tokens, top) if top is not None else None
    answer = _object(rid, served, [_choice(finished.text, finish_reason(finished), logprobs)])
    return {**answer, "usage": usage(accepted, finished)}


def chunks(rid: str, served: str, events: Iterator[Event], top: int | None, include_usage: bool) -> Iterator[str]:
    """Server-sent `text_completion` objects for one request's engine events."""
    offset = 0  # where the next token starts in the answer's text, for `text_offset`

    def token_object(token: Token) -> dict[str, Any]:
        nonlocal offset
        logprobs = legacy_logprobs([token], top, offset) if top is not None else None
        offset += len(token.text)
        return _object(rid, served, [_choice(token.text, None, logprobs)])

    yield from sse_stream(
        events,
        top,
        include_usage,
        token_object=token_object,
        finish_object=lambda finished: _object(rid, served, [_choice("", finish_reason(finished), None)]),
        usage_object=_object(rid, served, []),
    )
