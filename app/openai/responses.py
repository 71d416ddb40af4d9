"""`POST /v1/responses` for text, as vLLM serves it: `input` (a string or message items), `instructions`
(a system turn first), `max_output_tokens`, the sampling fields in KNOWN_FIELDS (fewer than the chat
endpoint's: min_p, the frequency and presence penalties and min_tokens are refused), `text.format` and
`structured_outputs` (app/openai/structured.py), and `stream` with the Responses event sequence
(response.created, response.in_progress, output_item.added, content_part.added, output_text.delta…,
output_text.done, content_part.done, output_item.done, response.completed). Nothing is stored, so `previous_response_id` and the tool and reasoning fields are
refused by name in OpenAI's error shape; the route joins the /v1 blueprint (app/openai/routes.py), so
the API key, origin check and error shape are the chat endpoint's."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from flask import jsonify, request

from app.engine_ext import get_engine
from app.openai import request_fields as rf
from app.openai import structured
from app.openai.fanout import merged, submit_all
from app.openai.routes import bp, collected, model_view, run_events, served_ids, streamed
from app.openai.shapes import check_model, finished_events, terminal_error
from app.protocol import parse_json_object
from model_runner.protocol.errors import UserError
from model_runner.protocol.events import Event, Finished, PrefillStart, Token
from model_runner.protocol.fields import json_repr
from model_runner.protocol.request import GenerateParams, parse_generate

KNOWN_FIELDS = (
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "repetition_penalty",
    "logit_bias",
    "stop",
    "ignore_eos",
    "stream",
    "model",
    "prompt_cache_key",  # vLLM reads and ignores it too
    "text",  # `text.format`: text, json_object or json_schema (app/openai/structured.py)
    "structured_outputs",
)
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text")
ITEM_FIELDS = ("type", "role", "content", "id", "status")


def _null(value: Any) -> bool:
    return value is None or value == [] or value == {}


# Responses fields that cannot apply here, accepted where their value changes nothing (else refused by name).
NEUTRAL: dict[str, tuple[Callable[[Any], bool], str]] = {
    "previous_response_id": (_null, "null: nothing is stored here; send the whole conversation as `input` items"),
    "background": (lambda v: v in (None, False), "false: answers run in the foreground"),
    "truncation": (lambda v: v in (None, "disabled"), '"disabled": a prompt too long for the context is refused'),
    "include": (_null, "empty: no extra output is included here"),
    "top_logprobs": (lambda v: v in (None, 0), "0: the Responses answer carries no logprobs here"),
    "reasoning": (_null, "null: the model has no reasoning setting"),
    "prompt": (_null, "null: stored prompt templates are not supported"),
    "max_tool_calls": (_null, "null: no tools are called here"),
    "stream_options": (lambda v: _null(v) or set(v) <= {"include_obfuscation"}, '{"include_obfuscation": …}'),
}


@dataclass(frozen=True)
class ResponsesCall:
    params: GenerateParams
    stream: bool
    instructions: str | None
    metadata: dict | None
    text: dict  # the `text` configuration, echoed in the answer as vLLM does


# ---- the request -------------------------------------------------------------------------------


def _check_fields(body: dict) -> None:
    for name, (accepts, neutral) in NEUTRAL.items():
        if name in body and not accepts(body[name]):
            raise UserError(
                f"`{name}` may only be {neutral}; got {json_repr(body[name])}", field=name, code="not_supported"
            )
    rf.check_neutral({k: v for k, v in body.items() if k not in NEUTRAL}, KNOWN_FIELDS)


def _item_text(content: Any, where: str) -> str:
    """An item's text: a string, or a list of input_text / output_text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise UserError(f"`{where}` must be a string or a list of input_text parts", field=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise UserError(
                f'`{where}[{j}]` must be a text part {{"type": "input_text", "text": …}}: this model reads text '
                f"only, got type {json_repr(kind)}",
                field=f"{where}[{j}]",
                code="not_supported",
            )
        texts.append(part["text"])
    return "".join(texts)


def _item(item: Any, i: int) -> dict[str, str]:
    where = f"input[{i}]"
    if not isinstance(item, dict):
        raise UserError(f"`{where}` must be a message item with `role` and `content`", field=where)
    if item.get("type", "message") != "message":
        raise UserError(
            f"`{where}.type` {json_repr(item.get('type'))} is not supported: only message items (text) are",
            field=f"{where}.type",
            code="not_supported",
        )
    for name in item:
        if name not in ITEM_FIELDS:
            raise UserError(f"unknown field {json_repr(f'{where}.{name}')} in an input item", field=f"{where}.{name}")
    if item.get("role") not in ROLES:
        raise UserError(
            f"`{where}.role` must be one of {', '.join(ROLES)}, got {json_repr(item.get('role'))}",
            field=f"{where}.role",
        )
    return {"role": ROLES[item["role"]], "content": _item_text(item.get("content"), f"{where}.content")}


def conversation(body: dict) -> list[dict[str, str]]:
    """`instructions` as the system turn, then `input` (a string is one user turn)."""
    raw, instructions = body.get("input"), body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise UserError("`instructions` must be a string", field="instructions")
    if isinstance(raw, str):
        turns = [{"role": "user", "content": raw}]
    elif isinstance(raw, list) and raw:
        turns = [_item(item, i) for i, item in enumerate(raw)]
    else:
        raise UserError("`input` must be a string or a non-empty list of message items", field="input")
    return ([{"role": "system", "content": instructions}] if instructions else []) + turns


def parse_responses(body: Any, ids: list[str], model: Any) -> ResponsesCall:
    """The request as one engine request; UserError naming the Responses field."""
    if not isinstance(body, dict):
        raise UserError("the request body must be a JSON object", field=None)
    try:
        _check_fields(body)
        check_model(body, ids)
        stream, _, _ = rf.stream_options({"stream": body.get("stream")})
        payload = {
            "messages": conversation(body),
            **rf.payload(body, body.get("max_output_tokens"), None, model.vocab),
            "candidates": 0,
        }
        params = parse_generate(payload, rf.limits(model.context))
        constraint = structured.constraint_of(body, "text.format")
        params = dataclasses.replace(params, constraint=constraint)
    except UserError as exc:
        if (exc.field or "").startswith("messages"):  # the conversation parse_generate saw is `input` here
            exc.message, exc.field = exc.message.replace("`messages`", "`input`"), "input"
        raise rf.rename_field(exc, {"max_new_tokens": "max_output_tokens"}) from None
    metadata = body.get("metadata") if isinstance(body.get("metadata"), dict) else None
    text = body.get("text") or {"format": {"type": "text"}}
    return ResponsesCall(params, stream, body.get("instructions"), metadata, text)


# ---- the answer --------------------------------------------------------------------------------


def usage(prompt: int, cached: int, output: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt,
        # cache_write_tokens: the SDK requires it; kvscope does not count prompt tokens written to its
        # prefix cache (vLLM does), so it is 0, not a measurement.
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


def message_item(item_id: str, text: str | None) -> dict[str, Any]:
    """The assistant's output message: empty and in progress until its text is known."""
    done = text is not None
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if done else []
    return {"id": item_id, "type": "message", "role": "assistant", "status": "completed" if done else "in_progress",
            "content": content}  # fmt: skip


def response_object(rid: str, served: str, call: ResponsesCall, created: int, **end: Any) -> dict[str, Any]:
    """The `response` object; `end` (status, output, usage) once the answer is known."""
    s = call.params.sampling
    status = end.get("status", "in_progress")
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": call.instructions,
        "metadata": call.metadata,
        "model": served,
        "output": end.get("output", []),
        "parallel_tool_calls": True,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "tool_choice": "auto",
        "tools": [],
        "background": False,
        "max_output_tokens": call.params.max_new_tokens,
        "previous_response_id": None,
        "reasoning": None,
        "service_tier": "auto",
        "text": call.text,
        "truncation": "disabled",
        "usage": end.get("usage"),
        "user": None,
    }


def status_of(finished: Finished) -> str:
    """vLLM's: an answer cut by its length is `incomplete` (reason max_output_tokens)."""
    return "incomplete" if finished.reason in ("max_tokens", "context_full", "timeout") else "completed"


def cached_tokens(events: list[Event]) -> int:
    """Prompt tokens the prefix cache supplied (measured by the engine's prefill)."""
    return next((e.cached_tokens for e in events if isinstance(e, PrefillStart)), 0)


def finished_response(rid: str, served: str, call: ResponsesCall, created: int, item_id: str, events: list[Event]):
    accepted, finished = finished_events(events)
    prompt = accepted.prompt_tokens if accepted is not None else 0
    return response_object(
        rid,
        served,
        call,
        created,
        status=status_of(finished),
        output=[message_item(item_id, finished.text)],
        usage=usage(prompt, cached_tokens(events), finished.tokens),
    )


class EventStream:
    """Server-sent Responses events, each with its `event:` line and the next sequence_number."""

    def __init__(self):
        self.sequence = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


def stream_events(rid: str, served: str, call: ResponsesCall, events: Iterator[tuple[int, Event]]) -> Iterator[str]:
    """The Responses event sequence for one answer's engine events; an engine error or cancel ends it
    with one `error` event (OpenAI's ResponseErrorEvent) instead of response.completed."""
    send, created, item_id = EventStream(), int(time.time()), f"msg_{uuid.uuid4().hex[:24]}"
    at = {"output_index": 0, "item_id": item_id}
    yield send("response.created", response=response_object(rid, served, call, created))
    yield send("response.in_progress", response=response_object(rid, served, call, created))
    yield send("response.output_item.added", output_index=0, item=message_item(item_id, None))
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    yield send("response.content_part.added", **at, content_index=0, part=part)
    seen: list[Event] = []
    for _, event in events:
        seen.append(event)
        if isinstance(event, Token) and event.text:
            yield send("response.output_text.delta", **at, content_index=0, delta=event.text, logprobs=[])
        elif isinstance(event, Finished):
            done = finished_response(rid, served, call, created, item_id, seen)
            text = done["output"][0]["content"][0]["text"]
            yield send("response.output_text.done", **at, content_index=0, text=text, logprobs=[])
            yield send("response.content_part.done", **at, content_index=0, part={**part, "text": text})
            yield send("response.output_item.done", output_index=0, item=done["output"][0])
            yield send("response.completed", response=done)
        elif event.terminal:
            error = terminal_error(event)
            yield send("error", code=error.code, message=error.message, param=error.field)


# ---- the route ---------------------------------------------------------------------------------


@bp.post("/v1/responses")
def responses():
    ids = served_ids()
    body = parse_json_object(request.get_data(as_text=True))
    call = parse_responses(body, ids, model_view())
    rid = f"resp_{uuid.uuid4().hex[:24]}"
    handles = submit_all(get_engine(), [call.params], rid, ("input", "max_output_tokens"))
    if call.stream:
        events = merged(handles, run_events)
        return streamed(events, stream_events(rid, ids[0], call, events))
    (events,) = collected(handles)
    item_id = f"msg_{uuid.uuid4().hex[:24]}"
    return jsonify(finished_response(rid, ids[0], call, int(time.time()), item_id, events))
