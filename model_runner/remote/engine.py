"""A remote engine: the same interface the app uses from `Engine`, driven by a remote OpenAI-compatible
server (vLLM, llama.cpp, another kvscope) over streaming /v1/chat/completions. Each request runs on its
own thread and ends with exactly one terminal event; tokens come from the remote stream, stamped by
kvscope's clock, so TTFT, ITL and E2E are measured here. What a client cannot see from outside (queue
vs prefill, per-request cache bytes, KV blocks, batch size) is null, never invented. The request sent
is built in remote/chat_request.py; its streamed answer becomes events in remote/answer.py."""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from model_runner.protocol import events as ev
from model_runner.protocol.errors import UserError
from model_runner.protocol.request import GenerateParams
from model_runner.remote.answer import RemoteRequest
from model_runner.remote.chat_request import accepted_event, chat_body, refuse_unsupported
from model_runner.remote.facts import (
    NOT_VISIBLE,
    RemoteFacts,
    config_path,
    facts_from,
    load_tokenizer,
    parse_metrics,
    read_config,
)
from model_runner.remote.http import Connection, RemoteFailure, get, parse_url, refused, sse_data
from model_runner.shared.base import EngineBase
from model_runner.shared.endings import publish_end
from model_runner.shared.feed import EngineFeed
from model_runner.shared.policy import Policy
from model_runner.shared.sequence import Sequence
from model_runner.shared.stream import RequestHandle
from model_runner.text.prompt import PromptView, plan

log = logging.getLogger("kvscope.remote")

TOP_LOGPROBS = 5  # candidates asked per token by default (kvscope's own /v1 allows at most 5)
API_KEY_ENV = "KVSCOPE_ENGINE_API_KEY"  # the upstream server's key (vLLM --api-key), never logged


@dataclass(frozen=True)
class RemoteConfig:
    url: str  # openai:http://HOST:PORT[/v1]
    model: str | None = None  # the remote model id; None = the first one the server lists
    engine_config: str | None = None  # the model's config.json or its folder (facts, tokenizer)
    max_queue: int = 64  # requests in flight at once through this proxy; more are answered overloaded
    timeout_s: float = 120.0  # per request, from submit, as the built-in engine's
    connect_s: float = 5.0
    stall_s: float = 60.0  # longest silence from the server inside one answer
    metrics_every_s: float = 2.0  # how often the server's /metrics is read (0 = never)
    # Candidates per token; 0 = ask for no logprobs (prob and candidates not visible): on llama.cpp's
    # server asking costs several times the decode time (docs/scale.md).
    top_logprobs: int = TOP_LOGPROBS
    event_buffer: int = 1024


class RemoteEngine(EngineBase):
    def __init__(self, config: RemoteConfig):
        super().__init__()
        self.config = config
        self.root, self.api = parse_url(config.url)
        self._config_file, self._folder = config_path(config.engine_config)
        self._model_config = read_config(self._config_file)
        self.feed = EngineFeed()
        self.tokenizer = None
        self._facts: RemoteFacts | None = None
        self._status, self._reason = "loading", f"connecting to the remote server at {self.root}"
        self._lock = threading.Lock()
        self._active: dict[str, RemoteRequest] = {}  # engine key → request
        self._keys = itertools.count(1)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server: dict[str, Any] = {}  # the server's /metrics, parsed, with when and whether it answered
        self._headers = {"Authorization": f"Bearer {os.environ[API_KEY_ENV]}"} if os.environ.get(API_KEY_ENV) else {}

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> RemoteEngine:
        for target, name in ((self._connect, "kvscope-remote-connect"), (self._poll_metrics, "kvscope-remote-metrics")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def shutdown(self) -> None:
        self._stopping.set()
        with self._lock:
            requests = list(self._active.values())
        for req in requests:
            self._cancel(req.seq, "shutdown")
        for thread in self._threads:
            thread.join(timeout=5)

    @property
    def facts(self) -> RemoteFacts | None:
        return self._facts

    @property
    def local(self) -> None:
        """The model runs on the remote server: no pool, no admission holds, no feed text here."""
        return None

    def health(self) -> tuple[bool, str]:
        if self._status == "failed":
            return False, f"remote engine unusable: {self._reason}"
        return True, self._status

    def describe_ready(self) -> None:
        if self._status == "loading":
            raise UserError(f"the model is not ready yet: {self._reason}", code="model_loading")
        if self._status != "ready":
            raise UserError(f"the model is not available: {self._reason}", code="model_failed")

    def _connect(self) -> None:
        """Ask the server which models it serves until it answers (it may still be starting)."""
        while not self._stopping.is_set():
            try:
                self._facts = self._read_facts()
                self.tokenizer = load_tokenizer(self._folder)
                self._status, self._reason = "ready", None
                log.info("remote engine: %s at %s", self._facts.name, self.root)
                return
            except RemoteFailure as exc:
                self._reason = exc.message
            except UserError as exc:  # the server answers, but cannot serve what was asked
                self._status, self._reason = "failed", exc.message
                log.error("remote engine: %s", exc.message)
                return
            self._stopping.wait(1.0)

    def _read_facts(self) -> RemoteFacts:
        status, body = get(self.root, f"{self.api}/models", self._headers, self.config.connect_s)
        if status in (401, 403):
            raise UserError(
                f"the remote server at {self.root} refused kvscope (HTTP {status}): set {API_KEY_ENV} to its API key"
            )
        if status != 200:
            raise RemoteFailure("remote_unavailable", f"the remote server at {self.root} answered HTTP {status}")
        try:
            cards = [c for c in json.loads(body)["data"] if isinstance(c, dict) and isinstance(c.get("id"), str)]
        except (ValueError, KeyError, TypeError):
            raise UserError(f"the remote server at {self.root} answered /v1/models with something not OpenAI-shaped")
        ids = [c["id"] for c in cards]
        wanted = self.config.model or (ids[0] if ids else None)
        if wanted not in ids:
            raise UserError(
                f"the remote server at {self.root} serves {', '.join(ids) or 'no model'}, not {wanted!r} "
                "(--engine-model)",
                field="engine_model",
            )
        card = next(c for c in cards if c["id"] == wanted)
        return facts_from(wanted, self.root, self._model_config, card)

    def _poll_metrics(self) -> None:
        every = self.config.metrics_every_s
        while every > 0 and not self._stopping.wait(every if self._server else 0.2):
            try:
                status, body = get(self.root, "/metrics", self._headers, min(every, 5.0))
                found = parse_metrics(body.decode("utf-8", "replace")) if status == 200 else {}
            except RemoteFailure:
                found = {}
            self._server = {"visible": bool(found), "read_at": time.time(), **found}

    # ---- requests ----------------------------------------------------------------------------------

    def describe_prompt(self, params: GenerateParams) -> dict[str, Any]:
        self.describe_ready()
        if self.tokenizer is None or not self._facts.context_window:
            raise UserError(
                "the prompt's tokens are not visible from outside the remote server: start kvscope with "
                "--engine-config FOLDER holding the model's config.json and tokenizer to see them",
                code="not_visible",
            )
        view = plan(self.tokenizer, params, self._facts.context_window).to_dict()
        return {**view, "provenance": "computed with the local tokenizer from --engine-config"}

    def submit(
        self, params: GenerateParams, request_id: str | None = None, label: str = "", feed_text: bool | None = None
    ) -> RequestHandle:
        """Start a request on the remote server; UserError when it cannot be (not ready, a field the
        remote cannot honour, too many in flight). `feed_text` is accepted for the class view's sake
        and has no effect: this feed carries no text."""
        self.describe_ready()
        refuse_unsupported(params, has_tokenizer=self.tokenizer is not None)
        view = self._plan(params)
        key = f"r{next(self._keys)}"
        seq = Sequence(id=request_id or f"req-{key}", params=params, key=key, label=label)
        seq.max_new_tokens = view.budget["max_new_tokens"] if view else params.max_new_tokens
        seq.prompt_ids = list(view.ids) if view else []
        handle = seq.stream = RequestHandle(seq, self.config.event_buffer, self._cancel)
        prompt_tokens = view.prompt_tokens if view else None
        req = RemoteRequest(seq, handle, prompt_tokens, self.root, self._facts.kv_bytes_per_token)
        with self._lock:
            if self._stopping.is_set():
                raise UserError("the server is shutting down", code="model_failed")
            if len(self._active) >= self.config.max_queue:
                raise UserError(
                    f"{self.config.max_queue} requests are in flight to the remote server; try again soon",
                    code="overloaded",
                )
            self._active[key] = req
        handle.push(accepted_event(seq, view, self._facts.context_window))
        self.feed.publish("engine_admit", request=key, label=label, prompt_tokens=req.prompt_tokens, remote=True)
        body = chat_body(params, view, self._facts.name, self.config.top_logprobs)
        threading.Thread(target=self._run, args=(req, body), name=f"kvscope-remote-{key}", daemon=True).start()
        return handle

    def _plan(self, params: GenerateParams) -> PromptView | None:
        """The local tokenizer's view of the prompt (counts, budget), or None when there is none."""
        if self.tokenizer is None or not self._facts.context_window:
            return None
        return plan(self.tokenizer, params, self._facts.context_window)

    # ---- one request's thread -----------------------------------------------------------------------

    def _run(self, req: RemoteRequest, body: dict[str, Any]) -> None:
        try:
            self._stream(req, body)
        except RemoteFailure as exc:
            self._fail(req, exc)
        except Exception as exc:  # a bug here must still end the request
            log.exception("remote request %s failed", req.seq.id)
            self._fail(req, RemoteFailure("internal", f"kvscope failed while relaying: {type(exc).__name__}: {exc}"))
        finally:
            if req.conn is not None:
                req.conn.close()

    def _stream(self, req: RemoteRequest, body: dict[str, Any]) -> None:
        seq = req.seq
        limit = min(seq.params.timeout_s or self.config.timeout_s, self.config.timeout_s)
        conn = Connection(self.root, self.config.connect_s, min(self.config.stall_s, limit))
        with req.lock:
            if req.ended:
                return
            req.conn = conn
        try:
            self._relay(req, conn, body, limit)
        except RemoteFailure as exc:
            if exc.code != "remote_timeout" or seq.ms_since_submit() < limit * 1000 - 50:
                raise
            self._finish(req, "timeout")  # the request's own time limit, as the built-in engine ends it

    def _relay(self, req: RemoteRequest, conn: Connection, body: dict[str, Any], limit: float) -> None:
        seq = req.seq
        conn.open()
        response = conn.request("POST", f"{self.api}/chat/completions", body, self._headers)
        if response.status != 200:
            raise refused(self.root, response)
        done = False
        for data in sse_data(conn, response):
            left = limit - seq.ms_since_submit() / 1000
            if left <= 0:
                self._finish(req, "timeout")
                return
            conn.set_read_timeout(min(self.config.stall_s, left))
            if data == "[DONE]":
                done = True
                break
            req.take_chunk(data)
            if req.ended:
                return
        if req.finish is None:
            how = "ended the stream" if done else "closed the stream"
            raise RemoteFailure(
                "remote_died",
                f"the remote server at {self.root} {how} mid-answer, after {len(seq.output_ids)} tokens "
                "and without a finish_reason",
            )
        self._finish(req, req.finish)

    # ---- endings -----------------------------------------------------------------------------------

    def _finish(self, req: RemoteRequest, reason: str) -> None:
        self._end(req, req.finished(reason))

    def _fail(self, req: RemoteRequest, exc: RemoteFailure) -> None:
        if exc.code == "cancelled":
            return  # the cancel has ended it already
        self._end(req, req.failed(exc))

    def cancel_all(self, cause: str) -> int:
        """Cancel every request in flight (the class view's cancel-all); returns how many."""
        with self._lock:
            requests = list(self._active.values())
        for req in requests:
            self._cancel(req.seq, cause)
        return len(requests)

    def _cancel(self, seq: Sequence, cause: str) -> None:
        """From any thread: end the request now and close its upstream stream (the server cancels)."""
        req = self._active.get(seq.key)
        if req is None:
            return
        seq.cancel_cause = seq.cancel_cause or cause
        self._end(req, req.cancelled())
        with req.lock:
            conn = req.conn
        if conn is not None:
            conn.abort()

    def _end(self, req: RemoteRequest, terminal: ev.Event) -> None:
        with req.lock:
            if req.ended:
                return
            req.ended = True
        with self._lock:
            self._active.pop(req.seq.key, None)
        self._tell_end_listeners(req.seq, terminal.to_dict())  # before the client sees its end, as Engine does
        req.handle.finish(terminal)
        publish_end(self.feed, req.seq, terminal, None)  # the blocks are the remote server's: not visible

    # ---- what the app reads ------------------------------------------------------------------------

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._active)

    @property
    def policy(self) -> None:
        return None  # the remote server's scheduling is its own

    def set_policy(self, changes: dict[str, Any] | None = None, /, **more: Any) -> Policy:
        raise UserError(
            f"scheduling policies belong to the remote server at {self.root} and cannot be changed from kvscope; "
            "set them when you start that server (e.g. vLLM's --max-num-seqs, --enable-prefix-caching)",
            code="not_supported",
        )

    def snapshot(self) -> dict[str, Any]:
        """What kvscope sees: its own requests in flight (measured here) and the server's /metrics
        figures (measured by the server), or why they are not visible."""
        server = dict(self._server)
        snap: dict[str, Any] = {
            "engine": "remote",
            "remote": self.root,
            "in_flight": self.active,
            "policy": None,
            "kv": None,
            "server": {**server, "provenance": "measured by the server (its /metrics)"}
            if server.get("visible")
            else {"visible": False, "why": f"{NOT_VISIBLE}: the server at {self.root} exposes no vLLM /metrics"},
        }
        for key in ("running", "waiting", "preemptions"):
            if key in server:  # kvscope's own /metrics re-exports these gauges under the same names
                snap[key] = int(server[key])
        return snap
