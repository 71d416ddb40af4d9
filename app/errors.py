"""The one error mapping of the HTTP API: a `UserError` code → its HTTP status (`STATUS`), and the
body in the shape each blueprint documents (docs/protocol.md): OpenAI's for /v1, `{"error": {...}}`
(with the same fields flat beside it) for the class and experiments APIs, flat `{code, field,
message}` everywhere else. Handlers are the app's own, so every blueprint answers through them.
"""

from __future__ import annotations

from typing import Any, Callable

from flask import Flask, current_app, jsonify, request
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from model_runner.protocol.errors import UserError

# Any code not listed answers 400: the request itself is at fault (`invalid_request`, `invalid_json`, …).
STATUS = {
    "invalid_api_key": 401,
    "forbidden": 403,
    "teacher_only": 403,
    "not_allowed": 403,
    "not_found": 404,
    "model_not_found": 404,
    "method_not_allowed": 405,
    "busy": 409,
    "too_large": 413,
    "internal": 500,
    "model_loading": 503,
    "model_failed": 503,
    "overloaded": 503,
}


def status_for(code: str) -> int:
    return STATUS.get(code, 400)


def flat_body(exc: UserError) -> dict[str, Any]:
    """The /api shape: the payload of the WebSocket `error` event."""
    return {"code": exc.code, "field": exc.field, "message": exc.message}


def nested_body(exc: UserError) -> dict[str, Any]:
    """The class and experiments APIs: nested under `error`, as their contracts say, plus the flat
    fields the rest of /api answers with, so either reader works."""
    body = flat_body(exc)
    return {"error": body, **body}


def openai_body(exc: UserError) -> dict[str, Any]:
    """OpenAI's error object; `param` names the OpenAI field at fault."""
    return {"error": {"message": exc.message, "type": "invalid_request_error", "param": exc.field, "code": exc.code}}


# Blueprint name → its body shape; any other blueprint (and none) answers flat.
SHAPES: dict[str, Callable[[UserError], dict[str, Any]]] = {
    "openai_api": openai_body,
    "classroom": nested_body,
    "experiments": nested_body,
}
# Blueprints whose every answer is JSON: an unexpected exception there answers one `internal` error
# in the blueprint's shape (the traceback goes to the log), never Flask's HTML page.
JSON_ONLY = frozenset({"api", "openai_api", "experiments"})


def error_response(exc: UserError, shape: Callable[[UserError], dict[str, Any]] | None = None):
    """The answer to `exc` in `shape`, else in the current blueprint's shape, with its status."""
    shape = shape or SHAPES.get(request.blueprint or "", flat_body)
    response = jsonify(shape(exc))
    response.status_code = status_for(exc.code)
    return response


def too_large_error() -> UserError:
    limit = current_app.config["MAX_CONTENT_LENGTH"]
    return UserError(f"the request body may be at most {limit:,} bytes", code="too_large")


def _on_user_error(exc: UserError):
    return error_response(exc)


def _on_too_large(exc: RequestEntityTooLarge):
    return error_response(too_large_error())


def _on_unexpected(exc: Exception):
    if isinstance(exc, HTTPException):  # 404, 405 and the like: werkzeug's own answer, but JSON under /v1
        return openai_http_error(exc) if is_openai_path(request.path) else exc
    if request.blueprint not in JSON_ONLY:
        raise exc  # Flask's own 500 (or, under TESTING, the exception itself)
    current_app.logger.exception("%s %s failed", request.method, request.path)
    message = f"{request.method} {request.path} failed: {type(exc).__name__}: {exc}"
    return error_response(UserError(message[:300], code="internal"))


def is_openai_path(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def openai_http_error(exc: HTTPException):
    """An unknown route or method under /v1 in OpenAI's error shape, as OpenAI's clients parse it."""
    if exc.code == 405:
        allowed = ", ".join(sorted(m for m in (exc.valid_methods or []) if m not in ("HEAD", "OPTIONS")))
        error = UserError(
            f"{request.method} is not allowed on {request.path}; use {allowed}", code="method_not_allowed"
        )
    elif exc.code == 404:
        error = UserError(f"no route {request.method} {request.path} here", code="not_found")
    else:
        error = UserError(exc.description or exc.name, code=exc.name.lower().replace(" ", "_"))
    response = error_response(error, openai_body)
    response.status_code = exc.code or 500
    if exc.code == 405 and exc.valid_methods:
        response.headers["Allow"] = ", ".join(exc.valid_methods)
    return response


def init_app(app: Flask) -> None:
    app.register_error_handler(UserError, _on_user_error)
    app.register_error_handler(RequestEntityTooLarge, _on_too_large)
    app.register_error_handler(Exception, _on_unexpected)
