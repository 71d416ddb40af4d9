"""`POST /v1/chat/completions`, both ways: an OpenAI chat request → kvscope `generate` requests, one
per choice (checked by `parse_generate` with the API's limits, which are the model's), and their
engine events → a `chat.completion` or its `chat.completion.chunk` stream (docs/protocol.md).

Messages: content as a string, a list of text parts, or null on an assistant turn; `developer` is a
system turn; a `tool` turn or an assistant's `tool_calls` only where the chat template has tool turns
(it names the `tool` role), else refused saying so."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Iterator

from app.openai import request_fields as rf
from app.openai import structured
from app.openai.fanout import with_seed
from app.openai.shapes import TokenNames, check_model, finish_reason, finished_events, logprob, sse, usage_of
from app.openai.streaming import sse_choices
from model_runner.protocol.errors import UserError
from model_runner.protocol.events import Event, Token
from model_runner.protocol.fields import check_int, json_repr
from model_runner.protocol.request import ROLES, GenerateParams, parse_generate

ROLE_NAMES = {"developer": "system"}  # OpenAI's newer name for the system turn
KNOWN_FIELDS = (
    *rf.SAMPLING_FIELDS,
    *structured.FIELDS,
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "logprobs",
    "top_logprobs",
)
MESSAGE_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id", "refusal", "function_call")


@dataclass(frozen=True)
class ChatCall:
    """A parsed chat request: one engine request per choice."""

    params: list[GenerateParams]
    top: int | None  # top_logprobs, or None when logprobs are off
    stream: bool
    include_usage: bool
    continuous_usage: bool


# ---- the request -------------------------------------------------------------------------------


def _text(content: Any, where: str) -> str:
    """A message's text: a string, a list of text parts joined, or null (an empty turn)."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise UserError(f"`{where}` must be a string or a list of text parts, got {json_repr(content)}", field=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise UserError(
                f'`{where}[{j}]` must be a text part {{"type": "text", "text": …}}: this model reads text only, '
                f"got type {json_repr(kind)}",
                field=f"{where}[{j}]",
            )
        texts.append(part["text"])
    return "".join(texts)


def _message(item: Any, i: int, tools_ok: bool) -> dict[str, str]:
    where = f"messages[{i}]"
    if not isinstance(item, dict):
        raise UserError(f"`{where}` must be an object with `role` and `content`", field=where)
    for name in item:
        if name not in MESSAGE_FIELDS:
            raise UserError(f"unknown field {json_repr(f'{where}.{name}')} in a message", field=f"{where}.{name}")
    role = ROLE_NAMES.get(item.get("role"), item.get("role"))
    if role == "tool" or item.get("tool_calls") or item.get("function_call"):
        if not tools_ok:
            raise UserError(
                f"`{where}` is a tool {'result' if role == 'tool' else 'call'}, but this model's chat template has no "
                "tool turns (it never names a `tool` role), so the model could not read it; send the tool's result "
                "as text in a user turn",
                field=f"{where}.role" if role == "tool" else f"{where}.tool_calls",
                code="not_supported",
            )
    allowed = (*ROLES[:3], "tool") if tools_ok else ROLES[:3]
    if role not in allowed:
        raise UserError(
            f"`{where}.role` must be one of {', '.join(allowed)} or developer, got {json_repr(item.get('role'))}",
            field=f"{where}.role",
        )
    if item.get("content") is None and role != "assistant":
        raise UserError(f"`{where}.content` may be null on an assistant turn only", field=f"{where}.content")
    return {"role": role, "content": _text(item.get("content"), f"{where}.content")}


def messages(raw: Any, tools_ok: bool) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not raw:
        raise UserError("`messages` must be a non-empty list of {role, content} objects", field="messages")
    return [_message(item, i, tools_ok) for i, item in enumerate(raw)]


def max_tokens_field(body: dict) -> tuple[str, Any]:
    """The OpenAI name used for the answer's length and its value."""
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return name, body.get(name)


def logprob_options(body: dict) -> int | None:
    """How many top alternatives per token to return, or None when `logprobs` is off."""
    wanted, top = body.get("logprobs"), body.get("top_logprobs")
    wanted = False if wanted is None else wanted
    if not isinstance(wanted, bool):
        raise UserError(f"`logprobs` must be true or false, got {json_repr(wanted)}", field="logprobs")
    if top is not None:
        check_int("top_logprobs", top, 0, rf.MAX_TOP_LOGPROBS)
        if not wanted:
            raise UserError("`top_logprobs` needs `logprobs` set to true", field="top_logprobs")
    return (top or 0) if wanted else None


def parse_chat(body: Any, ids: list[str], model: Any) -> ChatCall:
    """The chat request as engine requests; UserError naming the OpenAI field. `model`: the engine's
    facts and tokenizer (context window, vocabulary, whether the template has tool turns)."""
    if not isinstance(body, dict):
        raise UserError("the request body must be a JSON object", field=None)
    length_name, max_tokens = max_tokens_field(body)
    try:
        rf.check_neutral(body, KNOWN_FIELDS)
        check_model(body, ids)
        top = logprob_options(body)
        stream, include_usage, continuous = rf.stream_options(body)
        n, _ = rf.choices_count({"n": body.get("n")}, stream)
        payload = {
            "messages": messages(body.get("messages"), model.tool_turns),
            **rf.payload(body, max_tokens, None, model.vocab),
            "candidates": top or 0,
        }
        params = parse_generate(payload, rf.limits(model.context), roles=(*ROLES, "tool"))
        params = dataclasses.replace(params, constraint=structured.constraint_of(body))
    except UserError as exc:
        raise rf.rename_field(exc, {"max_new_tokens": length_name}) from None
    return ChatCall([with_seed(params, i) for i in range(n)], top, stream, include_usage, continuous)


# ---- the answer --------------------------------------------------------------------------------


def logprob_entry(token: Token, top: int, names: TokenNames) -> dict[str, Any]:
    name = names.of(token)
    return {
        "token": name,
        "logprob": logprob(token.prob),
        "bytes": list(names.raw(token.id, name)),
        "top_logprobs": [
            {"token": names.name(c.id, c.text), "logprob": logprob(c.prob), "bytes": list(names.raw(c.id, c.text))}
            for c in token.candidates[:top]
        ],
    }


def completion(rid: str, served: str, runs: list[list[Event]], call: ChatCall, names: TokenNames) -> dict[str, Any]:
    """The `chat.completion` object for the finished choices' events."""
    choices, prompt, generated = [], 0, 0
    for index, events in enumerate(runs):
        accepted, finished = finished_events(events)
        prompt = accepted.prompt_tokens if accepted is not None else prompt
        generated += finished.tokens
        choice = {
            "index": index,
            "message": {"role": "assistant", "content": finished.text},
            "finish_reason": finish_reason(finished),
            "logprobs": None,
        }
        if call.top is not None:
            tokens = [e for e in events if isinstance(e, Token)]
            choice["logprobs"] = {"content": [logprob_entry(e, call.top, names) for e in tokens]}
        choices.append(choice)
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": served,
        "choices": choices,
        "usage": usage_of(prompt, generated),
    }


def chunk(rid: str, served: str, index: int, delta: dict, finish: str | None = None, logprobs=None) -> dict[str, Any]:
    choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
    return {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": served,
        "choices": [choice],
    }


def chunks(
    rid: str, served: str, events: Iterator[tuple[int, Event]], call: ChatCall, names: TokenNames
) -> Iterator[str]:
    """Server-sent `chat.completion.chunk`s for the choices' merged engine events: each role first."""
    for index in range(len(call.params)):
        yield sse(chunk(rid, served, index, {"role": "assistant", "content": ""}))

    def token_object(index: int, token: Token):
        if not token.text and call.top is None:
            return None
        logprobs = {"content": [logprob_entry(token, call.top, names)]} if call.top is not None else None
        return chunk(rid, served, index, {"content": token.text}, logprobs=logprobs)

    yield from sse_choices(
        events,
        [0] * len(call.params),  # every choice answers the one conversation
        token_object,
        lambda index, finished: chunk(rid, served, index, {}, finish_reason(finished)),
        {**chunk(rid, served, 0, {}), "choices": []} if call.include_usage else None,
        continuous=call.continuous_usage,
    )
