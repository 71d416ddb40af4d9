"""The OpenAI-compatible endpoints (`/v1/models`, `/v1/models/{id}`, `/v1/chat/completions`,
`/v1/completions`) and the routes tools probe beside them (vLLM's `/health`, `/version`, `/tokenize`,
`/detokenize`, `/tokenizer_info`), on the same engine, queue and cancellation as the WebSocket protocol
(docs/protocol.md, "OpenAI-compatible API"); app/openai/chat.py and app/openai/completions.py map each
request and answer, app/openai/fanout.py runs a call's several engine requests together.

Contract:
- The model ids a client may send are `--served-model-name`'s (SERVED_MODEL_NAMES; the first is the
  one reported in answers) and the model's own name; any other `model` answers 404 `model_not_found`.
- A bad field answers in OpenAI's error shape (app/errors.py), `param` naming the OpenAI field.
- Requests run with label "api" in the engine feed; the response `id` is the engine request id (a call
  with several prompts or choices runs `id`-0, `id`-1, … in the engine).
- Streaming answers server-sent events ending with `data: [DONE]`; a client that goes away
  mid-stream cancels its request (cause `disconnect`), and so does a non-streaming client that hangs
  up where gunicorn exposes its socket (`watch_disconnect`).
- Every request's end is logged like a WebSocket request's (`request_ended`).
- With API_KEY set, every /v1 call needs `Authorization: Bearer KEY` (401 otherwise); the probes
  outside /v1 (health, version, tokenizer) answer without it, as vLLM's do.
"""

from __future__ import annotations

import hmac
import importlib.metadata
import logging
import select
import socket
import threading
import time
import uuid
from contextlib import closing
from dataclasses import dataclass
from typing import Iterator

from flask import Blueprint, Response, current_app, jsonify, request, stream_with_context

from app.engine_ext import get_engine
from app.errors import error_response, openai_body
from app.model_names import model_ids
from app.openai import chat as openai_chat
from app.openai import completions as openai_completions
from app.openai.fanout import merged, submit_all
from app.openai.shapes import TokenNames, check_model
from app.outcomes import describe_end, end_fields
from app.protocol import parse_json_object
from app.security import origin_refusal
from model_runner.protocol.errors import UserError
from model_runner.protocol.events import Event
from model_runner.protocol.fields import check_bool, check_int
from model_runner.protocol.request import Message
from model_runner.text.prompt import render

log = logging.getLogger(__name__)
bp = Blueprint("openai_api", __name__)

LABEL = "api"  # the engine feed's label for these requests (app/openai/fanout.py submits them)


@bp.before_request
def _check_origin():
    return origin_refusal(required=False)


@bp.before_request
def _check_api_key():
    """With API_KEY set, every /v1 call needs `Authorization: Bearer KEY` (compared in constant time,
    never logged); a missing or wrong key gets OpenAI's 401 shape."""
    key = current_app.config.get("API_KEY")
    if key is None or key == "" or not request.path.startswith("/v1/"):  # vLLM's --api-key guards /v1 only
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


# ---- the model, as the parsers see it -----------------------------------------------------------


@dataclass(frozen=True)
class ModelView:
    """What the request parsers need to know of the model: its context window and vocabulary (the
    limits), its tokenizer (token-id prompts, token names; None for a remote engine) and whether its
    chat template has tool turns."""

    context: int | None  # a remote engine may not know it
    vocab: int | None
    tokenizer: object | None

    @property
    def tool_turns(self) -> bool:
        template = getattr(self.tokenizer, "chat_template", None)
        return isinstance(template, str) and "tool" in template


def model_view() -> ModelView:
    engine = get_engine()
    engine.describe_ready()
    facts, local = engine.facts, engine.local
    tokenizer = local.loaded.tokenizer if local is not None else None
    return ModelView(facts.context_window, facts.vocab_size, tokenizer)


def local_tokenizer(what: str):
    """The built-in engine's tokenizer; a remote engine's is not here to use."""
    engine = get_engine()
    engine.describe_ready()
    if engine.local is None:
        raise UserError(
            f"`{what}` runs on the built-in engine only: a remote engine's tokenizer is not here", code="not_supported"
        )
    return engine.local.loaded.tokenizer


# ---- routes ------------------------------------------------------------------------------------


def model_card(name: str) -> dict:
    return {"id": name, "object": "model", "created": 0, "owned_by": "kvscope", "max_model_len": context_window()}


def context_window() -> int | None:
    facts = get_engine().facts
    return facts.context_window if facts is not None else None


@bp.get("/v1/models")
def models():
    return jsonify({"object": "list", "data": [model_card(name) for name in served_ids()]})


@bp.get("/v1/models/<path:model_id>")
def model(model_id: str):
    ids = served_ids()
    check_model({"model": model_id}, ids)
    return jsonify(model_card(model_id))


@bp.get("/health")
def health():
    """vLLM's health probe (guidellm's first call): 200 with no body while the engine can take requests."""
    ok, why = get_engine().health()
    if ok and get_engine().status()["status"] == "ready":
        return Response(status=200)
    return error_response(UserError(f"the model is not available: {why}", code="model_loading"))


@bp.get("/version")
def version():
    return jsonify({"version": package_version()})


def package_version() -> str:
    try:
        return importlib.metadata.version("kvscope")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@bp.post("/tokenize")
def tokenize():
    """vLLM's /tokenize: {"prompt": text} as written, or {"messages": [...]} through the chat template."""
    tokenizer = local_tokenizer("/tokenize")
    body = parse_json_object(request.get_data(as_text=True))
    check_model(body, served_ids())
    check_bool("return_token_strs", body.get("return_token_strs") or False)
    if "messages" in body:
        chat = openai_chat.messages(body.get("messages"), model_view().tool_turns)
        ids = render(tokenizer, tuple(Message(m["role"], m["content"]) for m in chat)).ids
    elif isinstance(body.get("prompt"), str):
        ids = tokenizer.encode(body["prompt"])[0]
    else:
        raise UserError('send {"prompt": "text"} or {"messages": [...]}', field="prompt")
    answer = {"count": len(ids), "max_model_len": context_window(), "tokens": ids}
    if body.get("return_token_strs"):
        answer["token_strs"] = [TokenNames(tokenizer).name(i) for i in ids]
    return jsonify(answer)


@bp.post("/detokenize")
def detokenize():
    """vLLM's /detokenize: {"tokens": [ids]} → {"prompt": their text}, control tokens included."""
    tokenizer = local_tokenizer("/detokenize")
    body = parse_json_object(request.get_data(as_text=True))
    check_model(body, served_ids())
    tokens = body.get("tokens")
    vocab = get_engine().facts.vocab_size
    if not isinstance(tokens, list):
        raise UserError('send {"tokens": [token ids]}', field="tokens")
    for token in tokens:
        check_int("tokens", token, 0, vocab - 1)
    return jsonify({"prompt": b"".join(tokenizer.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")})


@bp.get("/tokenizer_info")
def tokenizer_info():
    """vLLM's /tokenizer_info (lm-eval's remote tokenizer reads the end token and the chat template)."""
    tokenizer = local_tokenizer("/tokenizer_info")
    hf = getattr(tokenizer, "tok", None)
    names = TokenNames(tokenizer)
    eos = sorted(tokenizer.eos_ids)
    return jsonify(
        {
            "tokenizer_class": type(hf or tokenizer).__name__,
            "eos_token": getattr(hf, "eos_token", None) or (names.name(eos[0]) if eos else None),
            "bos_token": getattr(hf, "bos_token", None),
            "pad_token": getattr(hf, "pad_token", None),
            "chat_template": tokenizer.chat_template if hf is not None else None,
            "model_max_length": context_window(),
        }
    )


@bp.post("/v1/chat/completions")
def chat_completions():
    ids = served_ids()
    body = parse_json_object(request.get_data(as_text=True))
    call = openai_chat.parse_chat(body, ids, model_view())
    engine = get_engine()
    rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
    handles = submit_all(engine, call.params, rid, ("messages", openai_chat.max_tokens_field(body)[0]))
    names = TokenNames(model_view().tokenizer)
    if call.stream:
        events = merged(handles, run_events)
        return streamed(events, openai_chat.chunks(rid, ids[0], events, call, names))
    runs = collected(handles)
    return jsonify(openai_chat.completion(rid, ids[0], runs, call, names))


@bp.post("/v1/completions")
def completions():
    ids = served_ids()
    body = parse_json_object(request.get_data(as_text=True))
    if get_engine().local is None:
        raise UserError(
            "`POST /v1/completions` runs on the built-in engine only: a remote engine is driven through its chat API",
            code="not_supported",
            field="prompt",
        )
    call = openai_completions.parse_completion(body, ids, model_view())
    rid = f"cmpl-{uuid.uuid4().hex[:24]}"
    handles = submit_all(get_engine(), call.params, rid, ("prompt", "max_tokens"))
    names = TokenNames(model_view().tokenizer)
    if call.stream:
        events = merged(handles, run_events)
        return streamed(events, openai_completions.chunks(rid, ids[0], events, handles, call, names))
    runs = collected(handles)
    return jsonify(openai_completions.completion(rid, ids[0], runs, handles, call, names))


def streamed(events, lines: Iterator[str]) -> Response:
    body = stream_with_context(event_stream(events, lines))
    return Response(body, mimetype="text/event-stream", headers={"Cache-Control": "no-cache"})


def collected(handles: list) -> list[list[Event]]:
    """Each request's events to its end; a client that hangs up (where gunicorn shows it) cancels them all."""
    for handle in handles:
        watch_disconnect(handle, request.environ.get("gunicorn.socket"))
    runs: list[list[Event]] = [[] for _ in handles]
    for index, event in merged(handles, run_events):
        runs[index].append(event)
    return runs


def event_stream(events: Iterator, lines: Iterator[str]) -> Iterator[str]:
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
