"""Parsing what clients send, shared by the HTTP API and the WebSocket session: one JSON object per
message, request ids, and the `error` event a refused message is answered with."""

from __future__ import annotations

import json
import re
from typing import Any

from model_runner.protocol.errors import UserError
from model_runner.protocol.events import Error
from model_runner.protocol.fields import json_repr

REQUEST_ID_RE = re.compile(r"[A-Za-z0-9_.:\-]{1,64}\Z")


def parse_json_object(text: Any, not_an_object: str = "the message must be a JSON object with a `type`") -> dict:
    """Decode one client message; raise UserError(code="invalid_json") unless it is a JSON object.

    Python's json accepts NaN and Infinity: they pass here so the field check can name the field.
    A lone surrogate escape ("\\ud800") decodes to a str that cannot be encoded as UTF-8 later, in
    the tokenizer or on the way back out, so it is refused here.
    """
    if not isinstance(text, str):
        raise UserError("binary frames are not accepted: send JSON in a text frame", code="invalid_json")
    try:
        data = json.loads(text)
    except RecursionError:
        raise UserError("the JSON is nested too deeply", code="invalid_json") from None
    except ValueError as exc:
        raise UserError(f"the message is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise UserError(not_an_object, code="invalid_json")
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(
            "the JSON contains an unpaired surrogate escape (\\ud800–\\udfff)", code="invalid_json"
        ) from None
    return data


def error_event(request_id: str | None, exc: UserError) -> Error:
    return Error(request_id=request_id, t_ms=0.0, code=exc.code, message=exc.message, field=exc.field)


def parse_request_id(data: dict) -> str:
    """The message's `request_id`, or UserError naming the field and what it may hold."""
    rid = data.get("request_id")
    if isinstance(rid, str) and REQUEST_ID_RE.match(rid):
        return rid
    raise UserError(
        f"`request_id` must be 1 to 64 characters of A-Z a-z 0-9 _ . : -, got {json_repr(rid)}", field="request_id"
    )
