"""HTTP to a remote OpenAI-compatible server over the standard library's http.client, so kvscope
holds the socket: a cancel shuts it down from any thread (the server sees the stream close), every
read has a stall limit, and each failure becomes one `RemoteFailure` whose message says what happened."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from typing import Any, Iterator
from urllib.parse import urlsplit

from model_runner.protocol.errors import UserError

MAX_LINE = 1 << 20  # one SSE line (one JSON chunk) may be at most this long


class RemoteFailure(Exception):
    """A request to the remote server failed; `code` and `message` go into the `error` event."""

    def __init__(self, code: str, message: str, field: str | None = None):
        super().__init__(message)
        self.code, self.message, self.field = code, message, field


def parse_url(spec: str) -> tuple[str, str]:
    """`openai:URL` or URL → (server root, e.g. http://gpu:8000, and the API base path, e.g. /v1)."""
    url = spec.removeprefix("openai:").strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(
            f"--engine must be openai:http://HOST:PORT (an OpenAI-compatible server), got {spec!r}", field="engine"
        )
    if parts.username or parts.password:  # the address is shown on the page and in errors: no secret in it
        raise UserError(
            "--engine must not carry a user or password in its URL; pass the server's key in KVSCOPE_ENGINE_API_KEY",
            field="engine",
        )
    path = parts.path.rstrip("/")
    path = path if path.endswith("/v1") else path + "/v1"
    return f"{parts.scheme}://{parts.netloc}", path


class Connection:
    """One HTTP exchange with the server; `abort()` from any thread closes it under the reader."""

    def __init__(self, root: str, connect_s: float, read_s: float):
        parts = urlsplit(root)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        self.root = root
        self.read_s = read_s
        self._conn = cls(parts.hostname, parts.port, timeout=connect_s)
        self._lock = threading.Lock()
        self.aborted = False

    def open(self) -> None:
        try:
            self._conn.connect()
        except ConnectionRefusedError:
            raise RemoteFailure("remote_unavailable", f"the remote server at {self.root} refused the connection")
        except TimeoutError:
            raise RemoteFailure(
                "remote_unavailable",
                f"the remote server at {self.root} did not accept the connection within {self._conn.timeout:g} s",
            )
        except OSError as exc:
            raise RemoteFailure("remote_unavailable", f"could not reach the remote server at {self.root}: {exc}")
        with self._lock:
            if self.aborted:  # cancelled while connecting
                self._conn.close()
                raise RemoteFailure("cancelled", "cancelled")
        self._conn.sock.settimeout(self.read_s)

    def request(self, method: str, path: str, body: Any = None, headers: dict | None = None):
        """Send the request; the response (status, headers read) or RemoteFailure."""
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Accept": "text/event-stream, application/json", **(headers or {})}
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        try:
            self._conn.request(method, path, body=data, headers=hdrs)
            return self._conn.getresponse()
        except TimeoutError:
            raise self.stalled()
        except (OSError, http.client.HTTPException) as exc:
            raise self.broken(exc, "before answering")

    def stalled(self) -> RemoteFailure:
        return RemoteFailure(
            "remote_timeout", f"the remote server at {self.root} sent nothing for {self.read_s:g} s; gave up on it"
        )

    def broken(self, exc: BaseException, when: str) -> RemoteFailure:
        if self.aborted:
            return RemoteFailure("cancelled", "cancelled")
        return RemoteFailure(
            "remote_died", f"the remote server at {self.root} closed the connection {when} ({type(exc).__name__})"
        )

    def set_read_timeout(self, seconds: float) -> None:
        self.read_s = max(0.01, seconds)
        sock = self._conn.sock
        if sock is not None:
            sock.settimeout(self.read_s)

    def abort(self) -> None:
        """Close the stream now, from any thread: a blocked read returns and the server sees EOF."""
        with self._lock:
            self.aborted = True
            sock = self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self._conn.close()


def error_message(response) -> tuple[str, str | None]:
    """The server's error text (OpenAI shape or plain text) and the field it names, from a non-200 answer."""
    try:
        raw = response.read(64 * 1024)
    except (OSError, http.client.HTTPException):
        raw = b""
    try:
        error = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict):
        return str(error.get("message") or error)[:500], error.get("param")
    if isinstance(error, str):
        return error[:500], None
    return raw.decode("utf-8", "replace").strip()[:500] or response.reason, None


CODE_FOR_STATUS = {400: "invalid_request", 401: "remote_auth", 403: "remote_auth", 429: "overloaded", 503: "overloaded"}


def refused(root: str, response) -> RemoteFailure:
    message, field = error_message(response)
    code = CODE_FOR_STATUS.get(response.status, "remote_error")
    return RemoteFailure(code, f"the remote server at {root} answered HTTP {response.status}: {message}", field)


def sse_data(conn: Connection, response) -> Iterator[str]:
    """Each `data:` payload of a server-sent-event stream, to its end; RemoteFailure on a stall,
    a broken connection or a line that is not SSE."""
    data: list[str] = []
    while True:
        try:
            raw = response.readline(MAX_LINE + 1)
        except TimeoutError:
            raise conn.stalled() from None
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise conn.broken(exc, "mid-answer") from None
        if conn.aborted:
            raise RemoteFailure("cancelled", "cancelled")
        if not raw:
            if data:
                yield "\n".join(data)
            return
        if len(raw) > MAX_LINE:
            raise malformed(conn.root, "a line longer than 1 MiB")
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            raise malformed(conn.root, "bytes that are not UTF-8") from None
        if not line:
            if data:
                yield "\n".join(data)
            data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif line.startswith(":") or line.split(":", 1)[0] in ("event", "id", "retry"):
            continue  # a comment (keep-alive) or a field we do not use
        else:
            raise malformed(conn.root, repr(line[:80]))


def malformed(root: str, what: str) -> RemoteFailure:
    return RemoteFailure("remote_malformed", f"the remote server at {root} sent a malformed event stream: {what}")


def get(root: str, path: str, headers: dict, timeout: float) -> tuple[int, bytes]:
    """A short GET (model list, /metrics): (status, body) or RemoteFailure."""
    conn = Connection(root, timeout, timeout)
    try:
        conn.open()
        response = conn.request("GET", path, headers=headers)
        try:
            return response.status, response.read(4 << 20)
        except TimeoutError:
            raise conn.stalled() from None
        except (OSError, http.client.HTTPException) as exc:
            raise conn.broken(exc, "while answering") from None
    finally:
        conn.close()
