"""OpenAI-compatible endpoints (`/v1/models`, `/v1/chat/completions`) on the same engine, limits,
queue and cancellation as the WebSocket protocol (docs/protocol.md, "OpenAI-compatible API").

Contract:
- A chat request is mapped to a kvscope `generate` payload (`to_generate`) and validated by
  `parse_generate`, so every limit is the protocol's; a bad field answers 400 (503 for
  model_loading / overloaded) in OpenAI's error shape, `param` naming the OpenAI field.
- Absent `temperature` means 1.0 (as OpenAI), absent `max_tokens` the protocol's default (128).
- Requests run with label "api" in the engine feed; the response `id` is the engine request id.
- Non-streaming answers one `chat.completion`; streaming answers server-sent events: a role chunk,
  content chunks, a chunk with `finish_reason`, a usage chunk (with `stream_options.include_usage`),
  then `data: [DONE]`. A client that goes away mid-stream cancels its request (cause `disconnect`).
- Every request's end is logged like a WebSocket request's (`request_ended`).
- With API_KEY set, every /v1 call needs `Authorization: Bearer KEY` (401 otherwise); a non-streaming
  client that hangs up is cancelled too where gunicorn exposes its socket (`watch_disconnect`).
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import select
import socket
import threading
import time
import uuid
from contextlib import closing
from typing import Any, Iterator

from flask import Blueprint, Response, current_app, jsonify, request, stream_with_context
from werkzeug.exceptions import RequestEntityTooLarge

from model_runner.errors import UserError
from model_runner.events import Accepted, Event, Finished, Token
from model_runner.request import json_repr, parse_generate

from .api import STATUS_FOR_CODE, public_source
from .engine_ext import get_engine
from .protocol import parse_json_object
from .security import origin_refusal
from .session import describe_end, end_fields

log = logging.getLogger(__name__)
bp = Blueprint("openai_api", __name__)

LABEL = "api"
ROLES = ("system", "user", "assistant")
MAX_TOP_LOGPROBS = 5
FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "max_tokens": "length", "context_full": "length"}
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
# parse_generate's field names → the OpenAI names a client sent.
PARAM_NAMES = {"sampling.temperature": "temperature", "sampling.top_p": "top_p", "sampling.seed": "seed"}


# ---- errors ----------------------------------------------------------------------------------


def error_body(exc: UserError) -> dict[str, Any]:
    return {"error": {"message": exc.message, "type": "invalid_request_error", "param": exc.field, "code": exc.code}}


@bp.errorhandler(UserError)
def _user_error(exc: UserError):
    response = jsonify(error_body(exc))
    response.status_code = STATUS_FOR_CODE.get(exc.code, 400)
    return response


@bp.errorhandler(RequestEntityTooLarge)
def _too_large(exc):
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    return _user_error(UserError(f"the request body may be at most {limit:,} bytes", code="too_large"))


@bp.before_request
def _check_origin():
    return origin_refusal(required=False)


@bp.before_request
def _check_api_key():
    """With API_KEY set, every /v1 call needs `Authorization: Bearer KEY` (compared in constant time,
    never logged); a missing or wrong key gets OpenAI's 401 shape."""
    key = current_app.config.get("API_KEY")
    if key is None or key == "":
        return None
    sent = request.headers.get("Authorization", "")
    scheme, _, token = sent.partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), str(key).encode()):
        return None
    message = (
        "a valid API key is required: send `Authorization: Bearer <key>`" if not sent else "the API key is not valid"
    )
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}}
    response = jsonify(body)
    response.status_code = 401
    response.headers["WWW-Authenticate"] = "Bearer"
    return response


# ---- the request: OpenAI fields → a kvscope generate payload --------------------------------------


def model_id(engine) -> str:
    facts = engine.facts
    return public_source(facts.source or facts.name) if facts is not None else "kvscope"


def _refuse_unknown(body: dict) -> None:
    for name in body:
        if name not in KNOWN_FIELDS:
            raise UserError(f"unknown or unsupported field {json_repr(str(name))}", field=str(name)[:100])


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


def _max_tokens(body: dict) -> tuple[str, Any]:
    """The OpenAI name used for the answer's length and its value."""
    name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return name, body.get(name)


def _stop(raw: Any) -> Any:
    return [raw] if isinstance(raw, str) else raw


def _check_choices(body: dict, served: str) -> None:
    n = body.get("n")
    if n is not None and n != 1:
        raise UserError(f"`n` must be 1 (one answer per request), got {json_repr(n)}", field="n")
    model = body.get("model")
    if model is not None and model != served:
        raise UserError(
            f"`model` must be {served!r} (the model this server runs), got {json_repr(model)}", field="model"
        )


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


def stream_options(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream, options = body.get("stream", False), body.get("stream_options")
    if not isinstance(stream, bool):
        raise UserError(f"`stream` must be true or false, got {json_repr(stream)}", field="stream")
    if options is None:
        return stream, False
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise UserError('`stream_options` must be an object like {"include_usage": true}', field="stream_options")
    if not stream:
        raise UserError("`stream_options` needs `stream` set to true", field="stream_options")
    return stream, options.get("include_usage", False)


def to_generate(body: dict, served: str) -> dict[str, Any]:
    """The kvscope `generate` payload for an OpenAI chat request (checked by parse_generate next)."""
    if not isinstance(body, dict):
        raise UserError("the request body must be a JSON object", field=None)
    _refuse_unknown(body)
    _check_choices(body, served)
    name, max_tokens = _max_tokens(body)
    sampling = {"temperature": body.get("temperature", 1.0), "top_p": body.get("top_p", 1.0)}
    sampling = {k: (1.0 if v is None else v) for k, v in sampling.items()}
    if body.get("seed") is not None:
        sampling["seed"] = body["seed"]
    payload = {"messages": _messages(body.get("messages")), "sampling": sampling}
    if max_tokens is not None:
        payload["max_new_tokens"] = max_tokens
    if body.get("stop") is not None:
        payload["stop"] = _stop(body["stop"])
    return payload


def parse_chat(body: Any, served: str):
    """(GenerateParams, top_logprobs or None, stream, include_usage); UserError naming the OpenAI field."""
    try:
        top = logprob_options(body) if isinstance(body, dict) else None
        stream, include_usage = stream_options(body) if isinstance(body, dict) else (False, False)
        params = parse_generate(to_generate(body, served))
    except UserError as exc:
        raise rename_field(exc, body) from None
    return params, top, stream, include_usage


def rename_field(exc: UserError, body: Any) -> UserError:
    field = PARAM_NAMES.get(exc.field or "", exc.field)
    if field == "max_new_tokens" and isinstance(body, dict):
        field = _max_tokens(body)[0]
    if field != exc.field:
        exc.message = exc.message.replace(f"`{exc.field}`", f"`{field}`")
        exc.field = field
    return exc


# ---- the answer: engine events → OpenAI objects --------------------------------------------------


def logprob(prob: float) -> float:
    return math.log(prob) if prob > 0 else -9999.0


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


def finish_reason(event: Event) -> str:
    return FINISH_REASONS.get(getattr(event, "reason", ""), "length")


def usage(accepted: Accepted | None, finished: Finished) -> dict[str, int]:
    prompt = accepted.prompt_tokens if accepted is not None else 0
    return {"prompt_tokens": prompt, "completion_tokens": finished.tokens, "total_tokens": prompt + finished.tokens}


def terminal_error(event: Event) -> UserError:
    """A UserError for a request that ended without finishing (an engine error or a cancel)."""
    d = event.to_dict()
    if d["type"] == "error":
        return UserError(d["message"], code=d["code"], field=d.get("field"))
    return UserError(f"the request was cancelled ({d['cause']})", code="cancelled")


def completion(rid: str, served: str, events: list[Event], top: int | None) -> dict[str, Any]:
    """The `chat.completion` object for a finished request's events."""
    accepted = next((e for e in events if isinstance(e, Accepted)), None)
    finished = events[-1]
    if not isinstance(finished, Finished):
        raise terminal_error(finished)
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


def sse(data: Any) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def chunks(rid: str, served: str, events: Iterator[Event], top: int | None, include_usage: bool) -> Iterator[str]:
    """Server-sent events for one request's engine events, ending with `data: [DONE]`."""
    with closing(events):  # closed early (the client went away): the request is cancelled
        yield from _chunks(rid, served, events, top, include_usage)


def _chunks(rid: str, served: str, events: Iterator[Event], top: int | None, include_usage: bool) -> Iterator[str]:
    accepted = None
    yield sse(chunk(rid, served, {"role": "assistant", "content": ""}))
    for event in events:
        if isinstance(event, Accepted):
            accepted = event
        elif isinstance(event, Token) and (event.text or top is not None):
            lp = {"content": [logprob_entry(event, top)]} if top is not None else None
            yield sse(chunk(rid, served, {"content": event.text}, logprobs=lp))
        elif isinstance(event, Finished):
            yield sse(chunk(rid, served, {}, finish_reason(event)))
            if include_usage:
                yield sse({**chunk(rid, served, {}), "choices": [], "usage": usage(accepted, event)})
        elif event.terminal:
            yield sse(error_body(terminal_error(event)))
    yield sse("[DONE]")


# ---- running a request -------------------------------------------------------------------------


def run_events(handle) -> Iterator[Event]:
    """The request's events to its terminal one; a consumer that stops early (the client went away)
    cancels the request, and its end is logged either way."""
    last = None
    try:
        for last in handle:
            yield last
    finally:
        if last is None or not last.terminal:
            handle.cancel(cause="disconnect")
            last = handle_end(handle)
        log.info(
            "api: request %s ended: %s",
            handle.id,
            describe_end(last),
            extra={"kvscope": {"event": "request_ended", "request_id": handle.id, **end_fields(last)}},
        )


def handle_end(handle, timeout: float = 30.0) -> Event | None:
    """After a cancel, drain to the terminal event (so its outcome is logged), up to `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        event = handle.next_event(timeout=0.5)
        if event is not None and event.terminal:
            return event
    return None


def submit(params):
    rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    return rid, get_engine().submit(params, rid, label=LABEL)


# ---- routes ------------------------------------------------------------------------------------


@bp.get("/v1/models")
def models():
    engine = get_engine()
    engine.describe_ready()
    return jsonify(
        {"object": "list", "data": [{"id": model_id(engine), "object": "model", "created": 0, "owned_by": "kvscope"}]}
    )


@bp.post("/v1/chat/completions")
def chat_completions():
    engine = get_engine()
    engine.describe_ready()
    served = model_id(engine)
    body = parse_json_object(request.get_data(as_text=True))
    params, top, stream, include_usage = parse_chat(body, served)
    rid, handle = submit(params)
    events = run_events(handle)
    if stream:
        body_iter = stream_with_context(chunks(rid, served, events, top, include_usage))
        return Response(body_iter, mimetype="text/event-stream", headers={"Cache-Control": "no-cache"})
    watch_disconnect(handle, request.environ.get("gunicorn.socket"))  # a client that hangs up cancels
    answer = completion(rid, served, list(events), top)
    return jsonify(answer)


def client_gone(sock) -> bool:
    """True when the client has closed its end of the connection (readable, and a peek reads EOF)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (OSError, ValueError):  # a TLS socket cannot peek: not detectable, keep going
        return False


def watch_disconnect(handle, sock, every: float = 0.25) -> None:
    """Non-streaming answers: gunicorn hands the connection's socket in the WSGI environ, so a client
    that hangs up while its answer is being generated is seen and its request cancelled (cause
    `disconnect`). Without that socket (another WSGI server) it is not detectable: the answer runs to its end."""
    if not isinstance(sock, socket.socket):
        return

    def watch():
        while not handle.done:
            if client_gone(sock):
                handle.cancel(cause="disconnect")
                return
            time.sleep(every)

    threading.Thread(target=watch, name=f"kvscope-watch-{handle.id}", daemon=True).start()
