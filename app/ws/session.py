"""One WebSocket's side of the protocol (docs/protocol.md), independent of Flask.

`run_session(ws, engine, settings)` reads frames until the socket closes: each `generate` is checked
and submitted to the engine, and one pump thread per request forwards that request's events to the
socket under a single send lock, so the engine's worker never calls `send` and never waits on a
client. When the socket ends, every request still in flight is cancelled (cause `disconnect`).
`ws` needs `receive(timeout)`, `send(text)` and `close(reason, message)`, as simple-websocket has.
"""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from simple_websocket import ConnectionClosed
from wsproto.utilities import LocalProtocolError

from app.outcomes import describe_end, end_fields
from app.protocol import error_event, parse_json_object, parse_request_id
from model_runner.interface import EngineInterface
from model_runner.protocol.errors import UserError
from model_runner.protocol.events import SCHEMA_VERSION, Event
from model_runner.protocol.fields import json_repr
from model_runner.protocol.request import parse_generate

log = logging.getLogger(__name__)

# What a dead or stuck socket raises from send: closed by the peer, reset, or the send timed out.
SEND_FAILURES = (ConnectionClosed, OSError, LocalProtocolError)
CLOSE_NORMAL = 1000
SOCKET_NUMBERS = itertools.count(1)


@dataclass(frozen=True)
class SessionSettings:
    max_inflight: int = 4  # requests one socket may have in flight at once
    idle_timeout_s: float = 600.0  # close a socket with nothing in flight and no frame for this long
    poll_s: float = 0.5  # how often blocked loops look up to see whether the socket has ended
    drain_s: float = 30.0  # after the socket ends, how long a pump waits for its request's last event


class NoSeat:
    """The seat of a socket outside a classroom: no label, no cap or counters of its own (the session's
    per-socket cap applies), nothing to follow; every call is a no-op. A classroom's `Seat`
    (app/classroom/room.py) plays the same role in a class."""

    in_room = False
    label = ""

    def attach(self, send: Callable[[dict], bool]) -> None:
        pass

    def submit_options(self) -> dict[str, Any]:
        return {}

    def request_ended(self, refused: bool = False) -> None:
        pass

    def subscribed(self, feed) -> None:
        return None

    def unsubscribed(self) -> None:
        pass

    def leave(self) -> None:
        pass


def run_session(
    ws, engine: EngineInterface, settings: SessionSettings = SessionSettings(), peer: str = "", seat=None
) -> None:
    SocketSession(ws, engine, settings, peer, seat).run()


class SocketSession:
    """One socket's requests and feed subscription, talking to either engine through its declared
    interface (model_runner/interface.py) only."""

    def __init__(self, ws, engine: EngineInterface, settings: SessionSettings, peer: str = "", seat=None):
        self.ws = ws
        self.engine = engine
        self.settings = settings
        self.peer = peer or "?"
        self._send_lock = threading.Lock()
        self._open = True  # False once the socket has failed or the session ended (set under _send_lock)
        self._end_cause = "disconnect"
        self._lock = threading.Lock()  # guards _inflight
        self._inflight: dict[str, Any] = {}  # request id → RequestHandle, until its terminal event
        self._feed = None  # the engine feed subscription, after a `subscribe`
        # The class view's side of this socket (app/classroom/room.py: label, cap, rate limit, notices,
        # follow); outside a classroom a seat that does nothing.
        self.seat = seat if seat is not None else NoSeat()
        # how observers see this socket's requests
        self.label = self.seat.label or f"socket {next(SOCKET_NUMBERS)}"
        self.seat.attach(self._send_message)
        self._order_close_replies_after_sends()

    def _order_close_replies_after_sends(self) -> None:
        """simple-websocket's reader thread answers a client's close frame itself, while a pump may be half-way
        through a send (past its `connected` check): the data frame could then follow the close reply, which
        breaks the protocol (Chromium fails the socket: "Data frame received after close"). The reader's event
        handling takes the send lock, so that reply waits for the frame being sent and every later send sees the
        socket closed."""
        handle_events = getattr(self.ws, "_handle_events", None)
        if handle_events is None:  # not a simple-websocket socket (a test's stand-in)
            return

        def handle_events_between_sends():
            with self._send_lock:
                return handle_events()

        self.ws._handle_events = handle_events_between_sends

    # ---- the reader loop -----------------------------------------------------------------------

    def run(self) -> None:
        last_active = time.monotonic()
        try:
            while self._open:
                frame = self.ws.receive(timeout=self.settings.poll_s)
                now = time.monotonic()
                if frame is not None or self._inflight:
                    last_active = now
                if frame is not None:
                    self.handle_frame(frame)
                elif now - last_active > self.settings.idle_timeout_s:
                    self._close(CLOSE_NORMAL, f"idle for {self.settings.idle_timeout_s:g} s")
        except SEND_FAILURES:
            pass  # the client went away: the normal end of a session
        finally:
            self._end()

    def handle_frame(self, frame: Any) -> None:
        try:
            data = parse_json_object(frame)
        except UserError as exc:
            self._send_error(None, exc)
            return
        kind = data.get("type")
        try:
            if kind == "generate":
                self._generate(data)
            elif kind == "cancel":
                self._cancel(data)
            elif kind == "subscribe":
                self._subscribe()
            elif kind == "unsubscribe":
                self._unsubscribe()
            elif kind in ("follow", "unfollow") and self.seat.in_room:
                self.seat.follow(kind == "follow")
            else:
                self._send_error(
                    None,
                    UserError(
                        f"`type` must be 'generate', 'cancel', 'subscribe' or 'unsubscribe', got {json_repr(kind)}",
                        field="type",
                    ),
                )
        except Exception:  # a bug met by one odd frame must not take the socket and its other requests down
            log.exception("ws %s: handling a %r frame failed", self.peer, kind)
            self._send_error(None, UserError("the server failed to handle this message", code="internal"))

    def _request_id(self, data: dict) -> str | None:
        try:
            return parse_request_id(data)
        except UserError as exc:
            self._send_error(None, exc)
            return None

    def _generate(self, data: dict) -> None:
        rid = self._request_id(data)
        if rid is None:
            return
        with self._lock:
            busy, count = rid in self._inflight, len(self._inflight)
        if busy:  # answering with this id would look like the end of the request that holds it
            self._send_error(
                None,
                UserError(f"`request_id` {json_repr(rid)} is already in flight on this socket", field="request_id"),
            )
            return
        limit = self.settings.max_inflight
        if not self.seat.in_room and count >= limit:  # a seat checks its laptop's cap itself, in submit_options
            self._send_error(
                rid,
                UserError(
                    f"at most {limit} requests may be in flight on one socket; wait for one to end or cancel one",
                    code="too_many_requests",
                ),
            )
            return
        seated = False  # the seat counts the request in flight from submit_options on
        try:
            params = parse_generate(data)
            # A classroom seat adds its options (feed_text: "show prompts"); both engines take them.
            extra = self.seat.submit_options()
            seated = True
            handle = self.engine.submit(params, rid, label=self.label, **extra)
        except Exception as exc:
            if seated:
                self.seat.request_ended(refused=True)
            if not isinstance(exc, UserError):
                log.exception("ws %s: submitting request %s failed", self.peer, rid)
                exc = UserError("the server failed to start this request", code="internal")
            self._send_error(rid, exc)
            return
        with self._lock:
            self._inflight[rid] = handle
        threading.Thread(target=self._pump, args=(rid, handle), name=f"kvscope-pump-{rid}", daemon=True).start()

    def _cancel(self, data: dict) -> None:
        rid = self._request_id(data)
        if rid is None:
            return
        with self._lock:
            handle = self._inflight.get(rid)
        # A request that is not in flight has ended: its one terminal event is sent or on its way.
        if handle is not None:
            handle.cancel(cause="client")

    # ---- per-request pumps ---------------------------------------------------------------------

    def _pump(self, rid: str, handle) -> None:
        """Forward one request's events until its terminal event; after the socket ends, keep
        draining (without sending) so the engine's outcome of the cancel is logged."""
        last: Event | None = None
        drain_until = None
        try:
            while last is None or not last.terminal:
                event = handle.next_event(timeout=self.settings.poll_s)
                if event is None:
                    if not self._open:
                        drain_until = drain_until or time.monotonic() + self.settings.drain_s
                        if time.monotonic() > drain_until:
                            break
                    continue
                last = event
                if event.terminal:
                    self._forget(rid)  # before sending: a client that saw the end may reuse the slot at once
                self._send(event.to_json())
        except Exception:
            log.exception("ws %s: forwarding request %s failed", self.peer, rid)
            handle.cancel(cause="disconnect")
        finally:
            self._forget(rid)
            log.info(
                "ws %s: request %s ended: %s",
                self.peer,
                rid,
                describe_end(last),
                extra={"kvscope": {"event": "request_ended", "request_id": rid, **end_fields(last)}},
            )

    # ---- the engine feed ---------------------------------------------------------------------------

    def _subscribe(self) -> None:
        """Follow the engine feed on this socket: a snapshot now, then every engine event. The feed
        never waits for this socket: a reader that falls behind loses events and is told how many."""
        if self._feed is not None:
            return
        feed = self.engine.feed.subscribe()
        try:
            self._send(json.dumps({"type": "engine_snapshot", "schema": SCHEMA_VERSION, **self.engine.snapshot()}))
            counters = self.seat.subscribed(feed)  # the class counters: their state now, then stats every second
            if counters is not None:
                self._send_message(counters)
            threading.Thread(target=self._pump_feed, args=(feed,), name="kvscope-feed", daemon=True).start()
        except Exception:
            feed.close()  # no pump: the subscription must not linger in the feed
            raise
        self._feed = feed

    def _pump_feed(self, feed) -> None:
        while self._open and not feed.closed:
            event = feed.next_event(timeout=self.settings.poll_s)
            if event is not None and not self._send(json.dumps({**event, "schema": SCHEMA_VERSION})):
                break
        feed.close()

    def _unsubscribe(self) -> None:
        if self._feed is not None:
            self.seat.unsubscribed()
            self._feed.close()
            self._feed = None

    def _send_message(self, message: dict) -> bool:
        """A server message that belongs to no request (class notices and stages)."""
        return self._send(json.dumps({**message, "schema": SCHEMA_VERSION}))

    def _forget(self, rid: str) -> None:
        with self._lock:
            handle = self._inflight.pop(rid, None)
        if handle is not None:  # once per request: the pump calls this twice
            self.seat.request_ended()

    # ---- sending and ending ----------------------------------------------------------------------

    def _send(self, text: str) -> bool:
        with self._send_lock:
            if not self._open:
                return False
            try:
                self.ws.send(text)
                return True
            except SEND_FAILURES as exc:
                self._open = False
                # A send that timed out means the client stopped reading; anything else, it is gone.
                self._end_cause = "slow_client" if isinstance(exc, (TimeoutError, BlockingIOError)) else "disconnect"
        self._cancel_all()
        return False

    def _send_error(self, rid: str | None, exc: UserError) -> None:
        if self._send(error_event(rid, exc).to_json()):
            log.info(
                "ws %s: refused %s: %s%s",
                self.peer,
                rid or "a frame",
                exc.code,
                f" ({exc.field})" if exc.field else "",
                extra={
                    "kvscope": {"event": "request_refused", "request_id": rid, "code": exc.code, "field": exc.field}
                },
            )

    def _close(self, code: int, reason: str) -> None:
        with self._send_lock:
            if self._open:
                self._open = False
                try:
                    self.ws.close(code, reason)
                except SEND_FAILURES:
                    pass

    def _end(self) -> None:
        with self._send_lock:
            self._open = False
        self._unsubscribe()
        self.seat.leave()
        self._cancel_all()

    def _cancel_all(self) -> None:
        with self._lock:
            handles = list(self._inflight.values())
        for handle in handles:
            try:
                handle.cancel(cause=self._end_cause)
            except Exception:
                log.exception("ws %s: cancelling a request failed", self.peer)
