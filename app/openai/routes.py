"""The OpenAI-compatible endpoints (`/v1/models`, `/v1/chat/completions`, `/v1/completions`) on the
same engine, limits, queue and cancellation as the WebSocket protocol (docs/protocol.md,
"OpenAI-compatible API"); app/openai/chat.py and app/openai/completions.py map each request and answer.

Contract:
- The model ids a client may send are `--served-model-name`'s (SERVED_MODEL_NAMES; the first is the
  one reported in answers) and the model's own name; any other `model` answers 404 `model_not_found`.
- A bad field answers in OpenAI's error shape (app/errors.py), `param` naming the OpenAI field.
- Requests run with label "api" in the engine feed; the response `id` is the engine request id.
- Streaming answers server-sent events ending with `data: [DONE]`; a client that goes away
  mid-stream cancels its request (cause `disconnect`), and so does a non-streaming client that hangs
  up where gunicorn exposes its socket (`watch_disconnect`).
- Every request's end is logged like a WebSocket request's (`request_ended`).
- With API_KEY set, every /v1 call needs `Authorization: Bearer KEY` (401 otherwise).
"""

from __future__ import annotations

import hmac
import logging
import select
import socket
import threading
import time
import uuid
from contextlib import closing
from typing import Iterator

from flask import Blueprint, Response, current_app, jsonify, request, stream_with_context

from app.engine_ext import get_engine
from app.errors import openai_body
from app.openai import chat as openai_chat
from app.openai import completions as openai_completions
from app.openai.shapes import model_ids
from app.protocol import parse_json_object
from app.security import origin_refusal
from app.session import describe_end, end_fields
from model_runner.errors import UserError
from model_runner.events import Event

log = logging.getLogger(__name__)
bp = Blueprint("openai_api", __name__)

LABEL = "api"


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
    response = jsonify(openai_body(UserError(message, code="invalid_api_key")))
    response.status_code = 401
    response.headers["WWW-Authenticate"] = "Bearer"
    return response


def served_ids() -> list[str]:
    """The ids this server answers to, the reported one first (needs a ready engine)."""
    engine = get_engine()
    engine.describe_ready()  # model_loading / model_failed before the facts are read
    return model_ids(engine.facts, current_app.config.get("SERVED_MODEL_NAMES") or ())


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


# ---- routes ------------------------------------------------------------------------------------


@bp.get("/v1/models")
def models():
    cards = [{"id": name, "object": "model", "created": 0, "owned_by": "kvscope"} for name in served_ids()]
    return jsonify({"object": "list", "data": cards})


@bp.post("/v1/chat/completions")
def chat_completions():
    ids = served_ids()
    body = parse_json_object(request.get_data(as_text=True))
    params, top, stream, include_usage = openai_chat.parse_chat(body, ids)
    return answer(openai_chat, "chatcmpl", params, ids[0], top, stream, include_usage)


@bp.post("/v1/completions")
def completions():
    ids = served_ids()
    body = parse_json_object(request.get_data(as_text=True))
    params, top, stream, include_usage = openai_completions.parse_completion(body, ids)
    if get_engine().local is None:
        raise UserError(
            "`POST /v1/completions` runs on the built-in engine only: a remote engine is driven through its chat API",
            code="not_supported",
            field="prompt",
        )
    return answer(openai_completions, "cmpl", params, ids[0], top, stream, include_usage)


def answer(shape, prefix: str, params, served: str, top: int | None, stream: bool, include_usage: bool):
    """Run the request and answer it in `shape`'s objects (openai_chat or openai_completions)."""
    rid = f"{prefix}-{uuid.uuid4().hex[:24]}"
    handle = get_engine().submit(params, rid, label=LABEL)
    events = run_events(handle)
    if stream:
        body = stream_with_context(event_stream(events, shape.chunks(rid, served, events, top, include_usage)))
        return Response(body, mimetype="text/event-stream", headers={"Cache-Control": "no-cache"})
    watch_disconnect(handle, request.environ.get("gunicorn.socket"))  # a client that hangs up cancels
    return jsonify(shape.completion(rid, served, list(events), top))


def event_stream(events: Iterator[Event], lines: Iterator[str]) -> Iterator[str]:
    """`lines` (the answer's server-sent events, read from `events`); a stream closed early (the
    client went away) closes `events`, which cancels the request."""
    with closing(events):
        yield from lines


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
