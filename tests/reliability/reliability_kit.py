"""Clients and probes for the reliability suite: a protocol-speaking WebSocket client, a raw-socket
client that misbehaves on purpose (hand-written handshake, no reads, no pongs, TCP reset), an
in-process server around an in-process engine, and readers for the server's per-request log lines."""
from __future__ import annotations

import base64
import json
import logging
import os
import re
import socket
import struct
import threading
import time
from collections import defaultdict
from typing import Any, Callable

import psutil
from websockets.sync.client import connect

WAIT_S = 30.0  # a deadline for conditions that hold within milliseconds; never a timing claim
TERMINAL = frozenset({"finished", "cancelled", "error"})
HELLO = [{"role": "user", "content": "Say hello."}]
PING_INTERVAL_S = 3  # the slow server's pings: a silent client is closed after about two intervals
SEND_TIMEOUT_S = 1  # the slow server's send limit: a client that stops reading is dropped after it
ENDED_RE = re.compile(r"request (\S+) ended: (.*)$", re.M)


def terminals(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] in TERMINAL]


def generate_frame(rid: str | None, **fields) -> dict:
    return {"type": "generate", "request_id": rid, "messages": HELLO, **fields}


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = WAIT_S, every: float = 0.02):
    """Poll `predicate` until it returns something truthy; fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


# ---- a well-behaved client -----------------------------------------------------------------------

class Client:
    """A websockets (sync) client that speaks the protocol and files every event by request id."""

    def __init__(self, server, origin: str | None = None, **kwargs):
        self.ws = connect(server.ws_url, additional_headers={"Origin": origin or server.url},
                          open_timeout=WAIT_S, close_timeout=2, **kwargs)
        self.events: dict[str | None, list[dict]] = defaultdict(list)
        self.received_at: dict[str | None, list[float]] = defaultdict(list)

    def send(self, message) -> None:
        self.ws.send(message if isinstance(message, (str, bytes)) else json.dumps(message))

    def generate(self, rid: str, **fields) -> None:
        self.send(generate_frame(rid, **fields))

    def cancel(self, rid: str) -> None:
        self.send({"type": "cancel", "request_id": rid})

    def read_one(self, timeout: float) -> dict:
        event = json.loads(self.ws.recv(timeout=timeout))
        self.events[event.get("request_id")].append(event)
        self.received_at[event.get("request_id")].append(time.monotonic())
        return event

    def wait(self, rid: str | None, predicate: Callable[[list[dict]], Any] = terminals,
             timeout: float = WAIT_S) -> list[dict]:
        """Read frames until `predicate(events of rid)` holds; return those events."""
        deadline = time.monotonic() + timeout
        while not predicate(self.events[rid]):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"request {rid}: condition not met in {timeout:g} s; "
                                     f"saw {[e['type'] for e in self.events[rid]]}")
            try:
                self.read_one(left)
            except TimeoutError:
                continue
        return self.events[rid]

    def wait_type(self, rid: str | None, kind: str, timeout: float = WAIT_S) -> dict:
        events = self.wait(rid, lambda evs: any(e["type"] == kind for e in evs), timeout)
        return next(e for e in events if e["type"] == kind)

    def run(self, rid: str, **fields) -> list[dict]:
        """Send one generate and read its events up to and including its terminal event."""
        self.generate(rid, **fields)
        return self.wait(rid)

    def error_for_frame(self, frame, timeout: float = WAIT_S) -> dict:
        """Send a frame that names no usable request id; return the `error` answering it."""
        before = len(self.events[None])
        self.send(frame)
        return self.wait(None, lambda evs: len(evs) > before, timeout)[-1]

    def close(self) -> None:
        self.ws.close()

    def drop(self) -> None:
        """Leave without a closing handshake, as a killed tab or a closed laptop lid does: FIN now."""
        try:
            self.ws.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.ws.close()


# ---- a misbehaving client ------------------------------------------------------------------------

class RawClient:
    """A WebSocket client written by hand on a plain TCP socket, so that it can misbehave: send any
    headers, stop reading, never answer a ping, or reset the connection."""

    def __init__(self, port: int, headers: dict[str, str], rcvbuf: int | None = None, path: str = "/ws"):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:  # before connect, so the advertised window is small from the start
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(WAIT_S)
        self.sock.connect(("127.0.0.1", port))
        self.local_port = self.sock.getsockname()[1]
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [f"GET {path} HTTP/1.1", "Upgrade: websocket", "Connection: Upgrade",
                 f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.status, self.response_headers, self.body = self._read_response()
        self._buffer = b""

    def _read_response(self) -> tuple[int, str, bytes]:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(4096)
            if not chunk:
                break
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1]) if head else 0
        length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        while status != 101 and length and len(rest) < int(length.group(1)):  # a refusal's small body
            if not (chunk := self.sock.recv(4096)):
                break
            rest += chunk
        return status, head.decode("latin-1"), rest

    def send_text(self, text: str) -> None:
        self.sock.sendall(self._frame(text))

    def _frame(self, text: str) -> bytes:
        payload = text.encode()
        mask = os.urandom(4)
        n = len(payload)
        header = bytes([0x81])  # FIN + text
        if n < 126:
            header += bytes([0x80 | n])
        elif n < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        return header + mask + masked

    def read_frames(self, timeout: float) -> tuple[list[tuple[int, bytes]], bool]:
        """Everything the server sent until it closed the connection or `timeout` passed:
        ([(opcode, payload)], closed_by_server)."""
        deadline = time.monotonic() + timeout
        closed = False
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except (socket.timeout, TimeoutError):
                break
            except ConnectionResetError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            self._buffer += chunk
        frames = []
        while (frame := self._take_frame()) is not None:
            frames.append(frame)
        return frames, closed

    def _take_frame(self) -> tuple[int, bytes] | None:
        b = self._buffer
        if len(b) < 2:
            return None
        opcode, n, at = b[0] & 0x0F, b[1] & 0x7F, 2
        if n == 126:
            if len(b) < 4:
                return None
            n, at = struct.unpack("!H", b[2:4])[0], 4
        elif n == 127:
            if len(b) < 10:
                return None
            n, at = struct.unpack("!Q", b[2:10])[0], 10
        if len(b) < at + n:
            return None
        self._buffer = b[at + n:]
        return opcode, b[at:at + n]

    def reset(self) -> None:
        """Close with SO_LINGER (on, 0 s): the kernel sends RST instead of FIN."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def text_events(frames: list[tuple[int, bytes]]) -> list[dict]:
    return [json.loads(payload) for opcode, payload in frames if opcode == 0x1]


def close_code(frames: list[tuple[int, bytes]]) -> int | None:
    for opcode, payload in frames:
        if opcode == 0x8 and len(payload) >= 2:
            return struct.unpack("!H", payload[:2])[0]
    return None


def browser_headers(server, host: str | None = None, origin: str | None = None) -> dict[str, str]:
    host = host or f"127.0.0.1:{server.port}"
    return {"Host": host, "Origin": origin or f"http://{host}"}


def server_holds_connection(server, client_port: int) -> bool:
    """Whether any process of the server still has a socket open to this client port."""
    root = psutil.Process(server.proc.pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            if any(c.raddr and c.raddr.port == client_port for c in proc.net_connections(kind="tcp")):
                return True
        except psutil.NoSuchProcess:
            continue
    return False


# ---- reading the server's log ---------------------------------------------------------------------

class LogCursor:
    """The part of a server's log written after this cursor was made."""

    def __init__(self, server):
        self.server = server
        self.start = len(server.log())

    def text(self) -> str:
        return self.server.log()[self.start:]

    def ended(self) -> dict[str, list[str]]:
        """request id → how each request with that id ended, from the session's log lines."""
        out: dict[str, list[str]] = defaultdict(list)
        for rid, how in ENDED_RE.findall(self.text()):
            out[rid].append(how)
        return out

    def wait_ended(self, rids, timeout: float = WAIT_S) -> dict[str, str]:
        """Wait until every request in `rids` has its "ended" line; return rid → how it ended."""
        rids = set(rids)
        found = wait_until(lambda: (e := self.ended()) and rids <= e.keys() and e,
                           f"the end of {len(rids)} requests in the server log", timeout)
        return {rid: found[rid][-1] for rid in rids}

    def tracebacks(self) -> list[str]:
        text = self.text()
        return [line for line in text.splitlines() if "Traceback" in line or "Exception in thread" in line]


# ---- an in-process server -------------------------------------------------------------------------

class InProcessServer:
    """The Flask app (flask-sock on werkzeug's threaded server) around an engine the test holds,
    so a test can reach into the engine (inject faults, count steps) while clients use real sockets.
    Its `log()` is what the app and the engine logged, as the gunicorn server's log would show."""

    def __init__(self, engine, **config):
        from flask.logging import default_handler
        from werkzeug.serving import make_server

        from app import create_app
        self.app = create_app({"ENGINE": engine, "LOG_LEVEL": "INFO", **config})
        self._server = make_server("127.0.0.1", 0, self.app, threaded=True)
        self.port = self._server.server_port
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/ws"
        self._lines: list[str] = []
        self._handler = _ListHandler(self._lines)
        for name in ("app", "kvscope"):
            logger = logging.getLogger(name)
            logger.addHandler(self._handler)
            logger.setLevel(logging.INFO)
        # Flask's own stderr handler would echo every line into the test's output (a flood is 10,000s).
        logging.getLogger("app").removeHandler(default_handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="inprocess-server", daemon=True)
        self._thread.start()

    def log(self) -> str:
        return "".join(line + "\n" for line in list(self._lines))

    def stop(self) -> None:
        self._server.shutdown()
        for name in ("app", "kvscope"):
            logging.getLogger(name).removeHandler(self._handler)
        from flask.logging import default_handler
        logging.getLogger("app").addHandler(default_handler)


class _ListHandler(logging.Handler):
    def __init__(self, lines: list[str]):
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info:
            text += "\nTraceback (logged): " + logging.Formatter().formatException(record.exc_info)
        self.lines.append(text)
