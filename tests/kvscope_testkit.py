"""The test kit: every helper the test tiers share, in one module importable by name from any folder
(pyproject's `pythonpath = ["tests"]`). Fixtures live in tests/conftest.py and are built from this.

Contract:
- Servers: `LiveServer` (kvscope under gunicorn in a subprocess, as users run it) and `InProcessServer`
  (the Flask app around an engine the test holds). Both have `.url`, `.ws_url`, `.port`, `.log()` and
  `.stop()`; both log one JSON object a line (`log_as_json`), so tests read fields, never wording.
- Engines: `start_engine(model, **config)` is the one way tests make a started, ready engine.
- `Pool`: things made on demand from a config and stopped together, either one per config (shared)
  or a fresh one per call; the conftest's factory fixtures are pools.
- Clients: `Client` speaks the protocol; `RawClient` misbehaves on purpose on a plain TCP socket.
- Logs: `LogCursor` reads the structured records a server wrote after a point (`request_ended` etc.).
- Waiting: `wait_until(predicate)` polls a condition to a deadline; no test sleeps a fixed time.
- `screenshot(page, name)` writes artifacts/<name>.png.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import psutil
from websockets.sync.client import connect

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = os.environ.get("KVSCOPE_CHROMIUM", "/usr/bin/chromium")

WAIT_S = 30.0  # a deadline for conditions that hold within milliseconds; never a timing claim
TERMINAL = frozenset({"finished", "cancelled", "error"})
HELLO = [{"role": "user", "content": "Say hello."}]
PING_INTERVAL_S = 3  # the slow server's pings: a silent client is closed after about two intervals
SEND_TIMEOUT_S = 1  # the slow server's send limit: a client that stops reading is dropped after it
ONE_AT_A_TIME = json.dumps({"max_num_seqs": 1})  # KVSCOPE_POLICY for servers whose tests need a queue


def slow_server_env(**extra: str) -> dict[str, str]:
    """The slow server's settings: pings every few seconds and a 1 s send limit, so half-open and
    non-reading clients are found out within a test's time; the default frame limit."""
    from app import FRAME_LIMIT

    return {
        "KVSCOPE_SOCK_SERVER_OPTIONS": json.dumps({"max_message_size": FRAME_LIMIT, "ping_interval": PING_INTERVAL_S}),
        "KVSCOPE_SEND_TIMEOUT_S": str(SEND_TIMEOUT_S),
        **extra,
    }


def ready_timeout(model: str) -> float:
    """How long a model may take to load on the shared 2-core machine: the fake one is instant."""
    return 120.0 if model == "fake" or model.startswith("fake:") else 600.0


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


# ---- making things from a config, and stopping them ------------------------------------------------


class Pool:
    """Calls `make(*args, **kwargs)` on demand and `stop(thing)` on everything at `close()`.
    Shared: the same arguments give the same thing (one process per config for a whole session);
    otherwise every call makes a fresh one (a test that breaks what it gets needs its own)."""

    def __init__(self, make: Callable[..., Any], stop: Callable[[Any], None], shared: bool):
        self.make, self.stop, self.shared = make, stop, shared
        self.made: dict[str, Any] = {}

    def __call__(self, *args, **kwargs):
        key = json.dumps([args, kwargs], sort_keys=True, default=repr) if self.shared else str(len(self.made))
        if key not in self.made:
            self.made[key] = self.make(*args, **kwargs)
        return self.made[key]

    def close(self) -> None:
        for thing in reversed(list(self.made.values())):
            self.stop(thing)
        self.made.clear()

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def start_engine(model: str = "fake", **config):
    """An in-process engine, started and ready."""
    from model_runner.local.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(model=model, **config)).start()
    engine.wait_ready(ready_timeout(model))
    return engine


def stop_engine(engine) -> None:
    engine.shutdown()


# ---- structured server logs ---------------------------------------------------------------------


class JsonLogFormatter(logging.Formatter):
    """One JSON object a line: level, logger, message, the record's `kvscope` fields (app/ws/session.py
    puts a request's id and outcome there) and any exception. ASCII only, so any text survives."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {"level": record.levelname, "logger": record.name, "message": record.getMessage()}
        if isinstance(getattr(record, "kvscope", None), dict):
            entry["kvscope"] = record.kvscope
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=repr)


def log_as_json(stream=None) -> None:
    """Route every log record through JsonLogFormatter. Called in the server process before
    `kvscope.cli.main`, whose `logging.basicConfig` then leaves this root handler in place."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLogFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def log_records(text: str) -> list[dict]:
    """The JSON records in a log's text; other lines (gunicorn, prints, thread tracebacks) and a
    last line still being written are passed over."""
    records = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def end_is(end: dict, outcome: str, **fields) -> bool:
    """Whether a logged request end (`{"outcome": "cancelled", "cause": ..., "state": ..., "tokens": ...}`)
    has this outcome and these fields."""
    return end.get("outcome") == outcome and all(end.get(k) == v for k, v in fields.items())


class LogCursor:
    """What a server logged after this cursor was made, read as structured records."""

    def __init__(self, server):
        self.server = server
        self.start = len(server.log())

    def text(self) -> str:
        return self.server.log()[self.start :]

    def records(self) -> list[dict]:
        return log_records(self.text())

    def events(self, name: str) -> list[dict]:
        """The `kvscope` fields of every record of this event (`request_ended`, `request_refused`)."""
        return [r["kvscope"] for r in self.records() if r.get("kvscope", {}).get("event") == name]

    def ended(self) -> dict[str, list[dict]]:
        """request id → how each request with that id ended: outcome plus reason/cause/state/tokens/code."""
        out: dict[str, list[dict]] = defaultdict(list)
        for fields in self.events("request_ended"):
            out[fields["request_id"]].append({k: v for k, v in fields.items() if k not in ("event", "request_id")})
        return out

    def wait_ended(self, rids, timeout: float = WAIT_S) -> dict[str, dict]:
        """Wait until every request in `rids` has ended in the log; return rid → its (last) end."""
        rids = set(rids)
        found = wait_until(
            lambda: (e := self.ended()) and rids <= e.keys() and e,
            f"the end of {len(rids)} requests in the server log",
            timeout,
        )
        return {rid: found[rid][-1] for rid in rids}

    def wait_end(self, rid: str, timeout: float = WAIT_S, every: float = 0.02) -> dict:
        """Wait until this request has ended in the log; return its end."""
        return wait_until(lambda: self.ended().get(rid), f"the server to end request {rid}", timeout, every)[-1]

    def tracebacks(self) -> list[str]:
        """Logged exceptions, and tracebacks printed outside logging (a thread that died)."""
        logged = [r["message"] for r in self.records() if r.get("exc")]
        printed = [
            line
            for line in self.text().splitlines()
            if not line.startswith("{") and ("Traceback" in line or "Exception in thread" in line)
        ]
        return logged + printed


# ---- servers ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# `kvscope serve` exactly as the command runs it, but with log records written as JSON lines.
SERVE_WITH_JSON_LOG = (
    "import sys, kvscope_testkit; kvscope_testkit.log_as_json(); from kvscope.cli import main; sys.exit(main())"
)


class LiveServer:
    """kvscope under gunicorn (one worker, gthread) in a subprocess, as users run it."""

    def __init__(self, model: str = "fake", env: dict | None = None, args: list[str] | tuple = ()):
        self.model = model
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/ws"
        self.log_path = ARTIFACTS / f"server-{model.replace('/', '_')}-{self.port}.log"
        ARTIFACTS.mkdir(exist_ok=True)
        pythonpath = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
        # The eager step unless a test asks (`--compile` or KVSCOPE_COMPILE): a server that compiled its stretches
        # would spend half a minute of the suite's two cores in a C++ compiler (tests/live/test_compiled_live.py).
        base = {"KVSCOPE_COMPILE": "off", **os.environ}
        full_env = {**base, "PYTHONUNBUFFERED": "1", "PYTHONPATH": pythonpath, **(env or {})}
        cmd = [
            sys.executable,
            "-c",
            SERVE_WITH_JSON_LOG,
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--model",
            model,
            *args,
        ]
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/api/model", timeout=2) as r:
                    last = json.load(r)
                if last.get("status") == "ready":
                    return last
                if last.get("status") == "failed":
                    raise RuntimeError(f"model failed: {last}")
            except OSError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"server not ready after {timeout}s: {last}")

    def announced_url(self) -> str:
        """The address `kvscope serve` printed for people to open."""
        found = re.search(r"serving on (http://\S+?)/? ", self.log())
        assert found, f"the server printed no address:\n{self.log()[-2000:]}"
        return found.group(1)

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


def start_live_server(model: str = "fake", env: dict | None = None, args: list[str] | tuple = ()) -> LiveServer:
    """A LiveServer whose model is loaded; stopped again if it never gets there."""
    server = LiveServer(model, env, args)
    try:
        server.wait_ready(ready_timeout(model))
    except BaseException:
        server.stop()
        raise
    return server


class InProcessServer:
    """The Flask app (flask-sock on werkzeug's threaded server) around an engine the test holds,
    so a test can reach into the engine (inject faults, count steps) while clients use real sockets.
    Its `log()` holds what the app and the engine logged, as JSON lines like the live server's."""

    LOGGERS = ("app", "kvscope")

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
        for name in self.LOGGERS:
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
        from flask.logging import default_handler

        self._server.shutdown()
        for name in self.LOGGERS:
            logging.getLogger(name).removeHandler(self._handler)
        logging.getLogger("app").addHandler(default_handler)


class _ListHandler(logging.Handler):
    def __init__(self, lines: list[str]):
        super().__init__(logging.INFO)
        self.lines = lines
        self.setFormatter(JsonLogFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


# ---- a well-behaved client ----------------------------------------------------------------------


# ---- in-process requests --------------------------------------------------------------------------


def ask(content: str = "Tell me about caches.", system: str | None = None, **fields):
    """Validated `generate` parameters for one user message (and a system prompt if given)."""
    from model_runner.protocol.request import parse_generate

    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    return parse_generate({"messages": messages, **fields})


def blocks_mb(blocks: int) -> float:
    """kv_cache_mb for a pool of that many 16-token blocks (the fake keeps 256 bytes a token)."""
    return blocks * 16 * 256 / 2**20


class Recorder:
    """Every logits row an engine chooses a token from, per request id (the rows the sampler sees)."""

    def __init__(self, engine):
        self.rows: dict[str, list] = {}  # request id → its logits rows [vocab], in order
        choose = engine._post._choose

        def recording(seq, logits):
            self.rows.setdefault(seq.id, []).append(logits.clone())
            return choose(seq, logits)

        engine._post._choose = recording


def events_of(handle, timeout: float = 30.0) -> list[dict]:
    """Every event of a request up to its terminal one; fails instead of hanging."""
    out = []
    while True:
        event = handle.next_event(timeout)
        assert event is not None, f"{handle.id}: no event within {timeout:g} s after {[e['type'] for e in out]}"
        out.append(event.to_dict())
        if event.terminal:
            return out


def terminals(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] in TERMINAL]


def generate_frame(rid: str | None, **fields) -> dict:
    return {"type": "generate", "request_id": rid, "messages": HELLO, **fields}


class Client:
    """A websockets (sync) client that speaks the protocol and files every event by request id."""

    def __init__(self, server, origin: str | None = None, **kwargs):
        # Held open across calls and closed by close()/drop(), so not a context manager: say so.
        self.ws = connect(
            server.ws_url,
            additional_headers={"Origin": origin or server.url},
            open_timeout=WAIT_S,
            close_timeout=2,
            legacy=True,
            **kwargs,
        )
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

    def wait(
        self, rid: str | None, predicate: Callable[[list[dict]], Any] = terminals, timeout: float = WAIT_S
    ) -> list[dict]:
        """Read frames until `predicate(events of rid)` holds; return those events."""
        deadline = time.monotonic() + timeout
        while not predicate(self.events[rid]):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"request {rid}: condition not met in {timeout:g} s; saw {[e['type'] for e in self.events[rid]]}"
                )
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


# ---- a misbehaving client -----------------------------------------------------------------------


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
        lines = [
            f"GET {path} HTTP/1.1",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
        ]
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

    def read_until(self, kind: str, count: int = 1, timeout: float = WAIT_S) -> list[dict]:
        """Read text events until `count` of type `kind` have arrived; return all read so far."""
        seen: list[dict] = []
        wait_until(
            lambda: (
                seen.extend(text_events(self.read_frames(0.05)[0])) or sum(e["type"] == kind for e in seen) >= count
            ),
            f"{count} {kind!r} event(s)",
            timeout,
        )
        return seen

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
        self._buffer = b[at + n :]
        return opcode, b[at : at + n]

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


# ---- browsers -----------------------------------------------------------------------------------


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=False)
    return path
