"""Browser-facing defences for a local-first app: Host check (DNS rebinding), Origin check, headers.

`init_app` installs a Host check on every request and security headers on every response;
`origin_refusal()` is what the WebSocket blueprint and state-changing API routes call;
`policy_changes_allowed()` says whether clients may change the engine's scheduling policy here.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from flask import Flask, Response, current_app, jsonify, request

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})

CSP = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",  # CSP3: 'self' also matches ws:/wss: to the page's own host and port
        "frame-ancestors 'none'",
        "base-uri 'none'",
        "form-action 'self'",
    ]
)

HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",  # for browsers that predate frame-ancestors
    "Cross-Origin-Resource-Policy": "same-origin",
}


def init_app(app: Flask) -> None:
    app.before_request(_check_host)
    app.after_request(_add_headers)


def _add_headers(response: Response) -> Response:
    for name, value in HEADERS.items():
        response.headers.setdefault(name, value)
    if request.path.startswith("/api/") or request.path == "/healthz":
        response.headers["Cache-Control"] = "no-store"
    return response


# ---- Host ---------------------------------------------------------------------------------------


def split_host(host: str) -> tuple[str, int | None]:
    """'[::1]:8000' → ('::1', 8000); 'localhost' → ('localhost', None); raises ValueError if malformed."""
    parts = urlsplit("//" + host)
    if parts.username is not None or parts.path or parts.query or parts.fragment:
        raise ValueError(host)
    return (parts.hostname or ""), parts.port


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def policy_changes_allowed() -> bool:
    """Whether this server lets clients change scheduling policies (POST /api/engine/policy and the
    experiments that set one): ALLOW_POLICY_CHANGES when set, else only when listening on loopback."""
    allowed = current_app.config.get("ALLOW_POLICY_CHANGES")
    if allowed is None:
        allowed = is_loopback(str(current_app.config["BIND_HOST"]).strip("[]").lower())
    return bool(allowed)


def allowed_hosts(config) -> frozenset[str] | None:
    """The host names this server answers to, or None when any is fine (bound to a LAN address)."""
    if config.get("ALLOWED_HOSTS"):
        return frozenset(h.lower() for h in config["ALLOWED_HOSTS"])
    bind = str(config.get("BIND_HOST", "")).strip("[]").lower()
    if config.get("CLASS_MODE"):  # students use the LAN address or the hostname; every other name is refused
        names = {str(h).strip("[]").lower() for h in config.get("CLASS_HOSTS") or []}
        return LOOPBACK_HOSTS | names | ({bind} if bind not in ("0.0.0.0", "::", "") else set())
    return LOOPBACK_HOSTS | {bind} if is_loopback(bind) else None


def _check_host():
    """Refuse a Host header that is not ours: a DNS-rebinding page sends its own name as Host.

    Only the name is checked, not the port: an ssh tunnel (`-L 9000:localhost:8000`) legitimately
    changes the port, while a rebinding attack cannot make the browser send a loopback name.
    """
    hosts = allowed_hosts(current_app.config)
    if hosts is None:
        return None
    try:
        name, _ = split_host(request.headers.get("Host", ""))
    except ValueError:
        name = ""
    if name.lower() not in hosts:
        return _refuse(403, "bad_host", f"this server answers only to {', '.join(sorted(hosts))}")
    return None


# ---- Origin -------------------------------------------------------------------------------------


def normalize_origin(origin: str) -> str | None:
    """'HTTP://LocalHost:80' → 'http://localhost'; None for anything that is not scheme://host[:port]."""
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        return None
    default_port = 80 if parts.scheme == "http" else 443
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port and port != default_port else "")


def own_origin() -> str | None:
    """The origin of a page this server served: request scheme (ws→http) plus the Host header."""
    scheme = {"ws": "http", "wss": "https"}.get(request.scheme, request.scheme)
    return normalize_origin(f"{scheme}://{request.headers.get('Host', '')}")


def origin_refusal(*, required: bool) -> Response | None:
    """A 403 response unless the Origin header is ours or allow-listed; None when it may proceed.

    `required`: a WebSocket handshake must carry an Origin (every browser sends one); a plain HTTP
    client like curl sends none to the JSON API, and that is fine there.
    """
    origin = request.headers.get("Origin")
    if origin is None:
        return (
            _refuse(403, "origin_required", "a WebSocket handshake must carry an Origin header") if required else None
        )
    allowed = {normalize_origin(o) for o in current_app.config.get("ALLOWED_ORIGINS") or ()}
    allowed.add(own_origin())
    allowed.discard(None)
    if normalize_origin(origin) not in allowed:
        return _refuse(403, "origin_not_allowed", f"origin {origin[:100]!r} is not allowed to use this server")
    return None


def _refuse(status: int, code: str, message: str) -> Response:
    response = jsonify({"code": code, "field": None, "message": message})
    response.status_code = status
    return response
