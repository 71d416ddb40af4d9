"""A remote engine: the same interface the app uses from `Engine`, driven by a remote OpenAI-compatible
server (vLLM, llama.cpp, another kvscope) over streaming /v1/chat/completions. Each request runs on its
own thread and ends with exactly one terminal event; tokens come from the remote stream, stamped by
kvscope's clock, so TTFT, ITL and E2E are measured here. What a client cannot see from outside (queue
vs prefill, per-request cache bytes, KV blocks, batch size) is null, never invented."""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from model_runner import events as ev
from model_runner.core.feed import EngineFeed
from model_runner.core.sequence import Sequence
from model_runner.core.stream import RequestHandle
from model_runner.errors import UserError
from model_runner.metrics import request_metrics
from model_runner.remote.facts import NOT_VISIBLE, config_path, facts_from, load_tokenizer, parse_metrics, read_config
from model_runner.remote.http import Connection, RemoteFailure, get, parse_url, refused, sse_data
from model_runner.request import GenerateParams
from model_runner.text.prompt import plan

log = logging.getLogger("kvscope.remote")

TOP_LOGPROBS = 5  # candidates asked per token by default (kvscope's own /v1 allows at most 5)
STOP_REASONS = {"length": "max_tokens", "stop": "eos"}
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


class _Request:
    """One request in flight: its sequence, handle, upstream connection and how it ended."""

    def __init__(self, seq: Sequence, handle: RequestHandle, prompt_tokens: int | None):
        self.seq, self.handle, self.prompt_tokens = seq, handle, prompt_tokens
        self.conn: Connection | None = None
        self.lock = threading.Lock()
        self.ended = False
        self.text = ""
        self.usage: dict[str, Any] = {}
        self.finish: str | None = None


class RemoteEngine:
    def __init__(self, config: RemoteConfig):
        self.config = config
        self.root, self.api = parse_url(config.url)
        self._config_file, self._folder = config_path(config.engine_config)
        self._model_config = read_config(self._config_file)
        self.feed = EngineFeed()
        self.tokenizer = None
        self._facts = None
        self._status, self._reason = "loading", f"connecting to the remote server at {self.root}"
        self._lock = threading.Lock()
        self._active: dict[str, _Request] = {}  # engine key → request
        self._keys = itertools.count(1)
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._server: dict[str, Any] = {}  # the server's /metrics, parsed, with when and whether it answered
        self._end_listeners: list = []  # fn(sequence, terminal event dict), see add_end_listener
        self._failed_listeners: set[int] = set()  # listeners whose failure was logged once already
        self._headers = {"Authorization": f"Bearer {os.environ[API_KEY_ENV]}"} if os.environ.get(API_KEY_ENV) else {}

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> "RemoteEngine":
        for target, name in ((self._connect, "kvscope-remote-connect"), (self._poll_metrics, "kvscope-remote-metrics")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def wait_ready(self, timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while self._status == "loading" and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._status != "ready":
            raise RuntimeError(f"engine not ready: {self._status} {self._reason or ''}")

    def shutdown(self) -> None:
        self._stopping.set()
        with self._lock:
            requests = list(self._active.values())
        for req in requests:
            self._cancel(req.seq, "shutdown")
        for thread in self._threads:
            thread.join(timeout=5)

    def status(self) -> dict[str, Any]:
        return {"status": self._status, "reason": self._reason}

    @property
    def facts(self):
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

    def _read_facts(self):
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
        """`feed_text` is accepted for the class view's sake and has no effect: this feed carries no text."""
        """Start a request on the remote server; UserError when it cannot be (not ready, a field the
        remote cannot honour, too many in flight)."""
        self.describe_ready()
        self._refuse_unsupported(params)
        view = self._plan(params)
        key = f"r{next(self._keys)}"
        seq = Sequence(id=request_id or f"req-{key}", params=params, key=key, label=label)
        seq.max_new_tokens = view.budget["max_new_tokens"] if view else params.max_new_tokens
        seq.prompt_ids = list(view.ids) if view else []
        handle = seq.stream = RequestHandle(seq, self.config.event_buffer, self._cancel)
        req = _Request(seq, handle, view.prompt_tokens if view else None)
        with self._lock:
            if self._stopping.is_set():
                raise UserError("the server is shutting down", code="model_failed")
            if len(self._active) >= self.config.max_queue:
                raise UserError(
                    f"{self.config.max_queue} requests are in flight to the remote server; try again soon",
                    code="overloaded",
                )
            self._active[key] = req
        handle.push(self._accepted(seq, view))
        self.feed.publish("engine_admit", request=key, label=label, prompt_tokens=req.prompt_tokens, remote=True)
        body = self._body(params, view)
        threading.Thread(target=self._run, args=(req, body), name=f"kvscope-remote-{key}", daemon=True).start()
        return handle

    def _refuse_unsupported(self, params: GenerateParams) -> None:
        if not params.kv_cache:
            raise UserError("`kv_cache` cannot be turned off on a remote server: it always caches", field="kv_cache")
        if params.prefill_chunk:
            raise UserError(
                "`prefill_chunk` is the remote server's setting (e.g. vLLM's --max-num-batched-tokens), "
                "not a per-request field",
                field="prefill_chunk",
            )
        if params.overflow != "reject" and self.tokenizer is None:
            raise UserError(
                f"`overflow` {params.overflow!r} needs the prompt's token count: start kvscope with "
                "--engine-config FOLDER holding the model's tokenizer",
                field="overflow",
            )

    def _plan(self, params: GenerateParams):
        """The local tokenizer's view of the prompt (counts, budget), or None when there is none."""
        if self.tokenizer is None or not self._facts.context_window:
            return None
        return plan(self.tokenizer, params, self._facts.context_window)

    def _accepted(self, seq: Sequence, view) -> ev.Accepted:
        p = seq.params
        window = self._facts.context_window
        budget = (
            {**view.budget, "provenance": "computed with the local tokenizer"}
            if view
            else {
                "action": "none",
                "prompt_tokens": None,
                "max_new_tokens": p.max_new_tokens,
                "provenance": NOT_VISIBLE,
            }
        )
        counts = (view.prompt_tokens, view.content_tokens, view.template_tokens) if view else (None, None, None)
        return ev.Accepted(
            seq.id, seq.ms_since_submit(), *counts, seq.max_new_tokens, window, budget, p.delivery, True, 0
        )

    def _body(self, params: GenerateParams, view) -> dict[str, Any]:
        """The OpenAI chat request for these parameters (view: the messages after any truncation)."""
        messages = view.messages if view else params.messages
        s = params.sampling
        body = {
            "model": self._facts.name,
            "messages": [{"role": "user" if m.role == "retrieved" else m.role, "content": m.content} for m in messages],
            "max_tokens": params.max_new_tokens if view is None else view.budget["max_new_tokens"],
            "temperature": s.temperature,
            "top_p": s.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.config.top_logprobs > 0:
            body.update(logprobs=True, top_logprobs=self.config.top_logprobs)
        if s.seed is not None:
            body["seed"] = s.seed
        if s.top_k is not None:
            body["top_k"] = s.top_k  # vLLM and llama.cpp take it; a server that does not answers 400
        if params.stop:
            body["stop"] = list(params.stop)
        return body

    # ---- one request's thread -----------------------------------------------------------------------

    def _run(self, req: _Request, body: dict[str, Any]) -> None:
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

    def _stream(self, req: _Request, body: dict[str, Any]) -> None:
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

    def _relay(self, req: _Request, conn: Connection, body: dict[str, Any], limit: float) -> None:
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
            self._chunk(req, data)
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

    def _chunk(self, req: _Request, data: str) -> None:
        try:
            chunk = json.loads(data)
        except ValueError:
            raise RemoteFailure(
                "remote_malformed", f"the remote server at {self.root} sent a chunk that is not JSON: {data[:80]!r}"
            ) from None
        if not isinstance(chunk, dict):
            raise RemoteFailure("remote_malformed", f"the remote server at {self.root} sent {data[:80]!r}")
        if "error" in chunk:
            error = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            raise RemoteFailure(
                str(error.get("code") or "remote_error"),
                f"the remote server at {self.root} stopped with an error: {error.get('message')}",
            )
        if isinstance(chunk.get("usage"), dict):
            req.usage = chunk["usage"]
        choices = chunk.get("choices") or []
        if not isinstance(choices, list) or (choices and not isinstance(choices[0], dict)):
            raise RemoteFailure("remote_malformed", f"the remote server at {self.root} sent `choices` {data[:80]!r}")
        if choices:
            self._choice(req, choices[0])

    def _choice(self, req: _Request, choice: dict[str, Any]) -> None:
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        content = delta.get("content") or ""
        entries = (choice.get("logprobs") or {}).get("content") or []
        now = time.monotonic()
        if entries:  # one token event per token the server reports; the chunk's text goes with the last
            for i, entry in enumerate(entries):
                self._token(req, content if i == len(entries) - 1 else "", entry, now)
        elif content:
            self._token(req, content, None, now)
        reason = choice.get("finish_reason")
        if reason:
            stop = choice.get("stop_reason")  # vLLM: the stop string that matched
            req.finish = "stop_string" if isinstance(stop, str) else STOP_REASONS.get(reason, reason)

    def _token(self, req: _Request, text: str, entry: dict | None, now: float) -> None:
        seq = req.seq
        index = len(seq.output_ids)
        step_ms = (now - seq.token_times[-1]) * 1000 if seq.token_times else 0.0
        seq.output_ids.append(-1)  # the server sends token text, not ids
        seq.token_times.append(now)
        buffered = seq.params.delivery == "buffered"
        if text and seq.first_text_at is None and not buffered:
            seq.first_text_at = now
        seq.released_text += text
        req.text += text
        cache = req.prompt_tokens + index if req.prompt_tokens is not None else None
        per_token = self._facts.kv_bytes_per_token
        prob, candidates = self._probabilities(entry)
        event = ev.Token(
            seq.id,
            seq.ms_since_submit(now),
            index,
            None,  # id: not sent by the server
            "" if buffered else text,
            False,
            step_ms,
            cache,  # positions: prompt + tokens so far (computed), when the prompt was counted here
            None,  # cache bytes measured: not visible from outside the server
            cache * per_token if cache is not None and per_token else None,
            prob,
            candidates,
            None,
            None,
            None,
        )
        if not req.handle.push(event):  # the client fell behind: drop it as the engine does
            self._cancel(seq, "slow_client")

    @staticmethod
    def _probabilities(entry: dict | None) -> tuple[float | None, list[ev.Candidate]]:
        if not isinstance(entry, dict):
            return None, []

        def prob(item) -> float | None:
            lp = item.get("logprob") if isinstance(item, dict) else None
            return math.exp(lp) if isinstance(lp, (int, float)) else None

        tops = entry.get("top_logprobs") or []
        candidates = [ev.Candidate(None, str(t.get("token", "")), prob(t)) for t in tops if isinstance(t, dict)]
        return prob(entry), candidates

    # ---- endings -----------------------------------------------------------------------------------

    def _metrics(self, seq: Sequence, now: float) -> dict[str, Any]:
        """kvscope's clock figures; queue vs prefill is not visible from outside the server."""
        return {**request_metrics(seq, now), "queue_ms": None, "prefill_ms": None}

    def _finish(self, req: _Request, reason: str) -> None:
        seq, now = req.seq, time.monotonic()
        tokens = len(seq.output_ids)
        reported = req.usage.get("completion_tokens")
        if isinstance(reported, int) and reported > tokens:  # chunks without logprobs may hold several tokens
            tokens = reported
        terminal = ev.Finished(
            seq.id, seq.ms_since_submit(now), reason, tokens - 1, tokens, req.text, self._metrics(seq, now)
        )
        self._end(req, terminal)

    def _fail(self, req: _Request, exc: RemoteFailure) -> None:
        if exc.code == "cancelled":
            return  # the cancel has ended it already
        self._end(req, ev.Error(req.seq.id, req.seq.ms_since_submit(), exc.code, exc.message, exc.field))

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
        now = time.monotonic()
        state = "decode" if seq.output_ids else "waiting"  # queued or prefilling: not visible from outside
        terminal = ev.Cancelled(
            seq.id, seq.ms_since_submit(now), "cancelled", seq.cancel_cause, state, len(seq.output_ids), req.text,
            self._metrics(seq, now),
        )  # fmt: skip
        self._end(req, terminal)
        with req.lock:
            conn = req.conn
        if conn is not None:
            conn.abort()

    def _end(self, req: _Request, terminal: ev.Event) -> None:
        with req.lock:
            if req.ended:
                return
            req.ended = True
        with self._lock:
            self._active.pop(req.seq.key, None)
        self._tell_listeners(req.seq, terminal.to_dict())  # before the client sees its end, as Engine does
        req.handle.finish(terminal)
        self.feed.publish(
            "engine_end",
            request=req.seq.key,
            label=req.seq.label,
            outcome=terminal.type,
            reason=getattr(terminal, "reason", None) or getattr(terminal, "code", None),
            tokens=len(req.seq.output_ids),
            blocks_freed=None,
        )

    # ---- what the app reads ------------------------------------------------------------------------

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._active)

    @property
    def policy(self):
        return None  # the remote server's scheduling is its own

    def set_policy(self, changes: dict[str, Any] | None = None, /, **more: Any):
        raise UserError(
            f"scheduling policies belong to the remote server at {self.root} and cannot be changed from kvscope; "
            "set them when you start that server (e.g. vLLM's --max-num-seqs, --enable-prefix-caching)",
            code="not_supported",
        )

    def add_end_listener(self, fn) -> None:
        """Call fn(sequence, terminal event dict) once per request, at its end, as Engine does. The
        sequence has no `prefill_start` and the metrics' `queue_ms`/`prefill_ms` are None: a listener
        must cope with what is not visible from outside the server."""
        self._end_listeners.append(fn)

    def _tell_listeners(self, seq: Sequence, terminal: dict[str, Any]) -> None:
        for listener in self._end_listeners:
            try:
                listener(seq, terminal)
            except Exception as exc:  # an observer's bug never reaches the request; said once per listener
                if id(listener) not in self._failed_listeners:
                    self._failed_listeners.add(id(listener))
                    log.warning("end listener %r failed on a remote request: %s: %s", listener, type(exc).__name__, exc)

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
