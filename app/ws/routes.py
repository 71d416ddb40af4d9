"""The `/ws` route: refuses foreign origins before the handshake, caps open sockets, bounds how long
a send may block, then hands the socket to `session.run_session` with its seat (the factory passes
the classroom's `seat_for_socket`; without one every socket is a plain one).
"""

from __future__ import annotations

import socket
import struct
import threading
from contextlib import contextmanager
from typing import Any, Callable

from flask import Blueprint, Flask, current_app, request
from flask_sock import Sock

from app.engine_ext import get_engine
from app.security import origin_refusal
from app.ws.session import SessionSettings, run_session

bp = Blueprint("ws", __name__)
sock = Sock()
KEY = "kvscope_ws_slots"
SEATS_KEY = "kvscope_ws_seats"
CLOSE_TRY_AGAIN_LATER = 1013


class Slots:
    """Counts open sockets so a crowd of tabs cannot take every server thread from page loads."""

    def __init__(self, limit: int):
        self.limit = limit
        self.open = 0
        self._lock = threading.Lock()

    @contextmanager
    def take(self):
        with self._lock:
            granted = self.open < self.limit
            self.open += granted
        try:
            yield granted
        finally:
            if granted:
                with self._lock:
                    self.open -= 1


def init_app(app: Flask, seat_for_socket: Callable[[], Any] = lambda: None) -> None:
    """`seat_for_socket()`, called in each handshake's request context: the socket's seat, or None."""
    app.extensions[KEY] = Slots(int(app.config["MAX_SOCKETS"]))
    app.extensions[SEATS_KEY] = seat_for_socket
    app.register_blueprint(bp)


@bp.before_request
def _check_origin():
    # Runs before flask-sock answers the handshake, so a refused page gets a plain 403 and no socket.
    return origin_refusal(required=True)


def session_settings(config) -> SessionSettings:
    return SessionSettings(
        max_inflight=int(config["MAX_INFLIGHT_PER_SOCKET"]), idle_timeout_s=float(config["WS_IDLE_TIMEOUT_S"])
    )


def serve_socket(ws) -> None:
    """The `/ws` handler, run by flask-sock after the handshake, inside the request context."""
    config = current_app.config
    with current_app.extensions[KEY].take() as granted:
        if not granted:
            ws.close(CLOSE_TRY_AGAIN_LATER, f"the server has {config['MAX_SOCKETS']} sockets open; try again soon")
            return
        bound_send_time(ws, float(config["SEND_TIMEOUT_S"]))
        peer = f"{request.remote_addr}:{request.environ.get('REMOTE_PORT', '')}"
        seat = current_app.extensions[SEATS_KEY]()
        run_session(ws, get_engine(), session_settings(config), peer=peer, seat=seat)


sock.route("/ws", bp=bp)(serve_socket)


class _SendAllSocket:
    """The connection's socket, with `send` meaning "write the whole frame, or raise".

    simple-websocket writes each frame with one `sock.send`, from the session's threads and from
    its own ping thread. With a send timeout, `send` may write part of a frame and return quietly,
    and two writers may interleave their bytes; `sendall` under one lock does neither.
    """

    def __init__(self, raw: socket.socket):
        self._raw = raw
        self._lock = threading.Lock()

    def send(self, data: bytes) -> None:
        with self._lock:
            self._raw.sendall(data)

    def __getattr__(self, name):
        return getattr(self._raw, name)


SEND_BUFFER_BYTES = 64 * 1024


def bound_send_time(ws, seconds: float) -> None:
    """Make a send to a client that stopped reading fail after `seconds` instead of blocking its
    thread forever. SO_SNDTIMEO limits sends only; receives keep blocking as simple-websocket expects."""
    raw = getattr(ws, "sock", None)
    if not isinstance(raw, socket.socket) or seconds <= 0:
        return
    whole = int(seconds)
    try:
        # A modest send buffer, so a client that stops reading fills it within one answer and the
        # engine's bounded per-request buffer (then `slow_client`) is reachable, not hidden by MBs
        # of kernel buffering.
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", whole, int((seconds - whole) * 1e6)))
    except OSError:
        return  # a platform without SO_SNDTIMEO keeps plain blocking sends
    ws.sock = _SendAllSocket(raw)
