"""Structured outputs as vLLM takes them, read into one `Constraint` (model_runner/protocol/constraint.py):
OpenAI's `response_format` (`json_object`, or `json_schema` with its `schema`), vLLM's
`structured_outputs` (exactly one of `json`, `regex`, `choice`, `grammar`, `json_object`), and the
Responses API's `text.format`. The built-in engine compiles it when the request is submitted, so a
schema xgrammar refuses is a 400 naming the field before anything runs; a remote engine forwards it."""

from __future__ import annotations

from typing import Any

from model_runner.protocol.constraint import Constraint, check_ending, make_constraint
from model_runner.protocol.errors import UserError
from model_runner.protocol.fields import json_repr

FIELDS = ("response_format", "structured_outputs")  # the request fields read here (chat and completions)
STRUCTURED_KINDS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}
# vLLM 0.32's tuning switches: accepted at the values that change nothing here. (The old guided
# decoding's `disable_fallback` is not one of them: it is an unknown field, refused by name.)
STRUCTURED_NEUTRAL = {
    "disable_any_whitespace": (None, False, True),  # answers use xgrammar's ", " and ": " either way
    "disable_additional_properties": (None, False),
    "whitespace_pattern": (None,),
}


def from_response_format(value: Any, where: str = "response_format") -> Constraint | None:
    """OpenAI's `response_format` (also the Responses API's `text.format`, whose schema sits beside
    `type` rather than under `json_schema`)."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return make_constraint("json_object", None, where)
    if kind == "json_schema":
        inner = value if where != "response_format" else value.get("json_schema")
        inner_where = where if where != "response_format" else f"{where}.json_schema"
        if not isinstance(inner, dict) or "schema" not in inner:
            raise UserError(
                f"`{inner_where}.schema` is required for a json_schema format", field=f"{inner_where}.schema"
            )
        return make_constraint("json_schema", inner["schema"], f"{inner_where}.schema")
    raise UserError(
        f'`{where}.type` must be "text", "json_object" or "json_schema", got {json_repr(kind)}',
        field=f"{where}.type",
        code="not_supported" if isinstance(kind, str) else "invalid_request",
    )


def from_structured_outputs(value: Any) -> Constraint | None:
    """vLLM's `structured_outputs`: exactly one of its constraint fields."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise UserError("`structured_outputs` must be an object", field="structured_outputs")
    for name, neutral in STRUCTURED_NEUTRAL.items():
        if value.get(name) not in neutral:
            raise UserError(
                f"`structured_outputs.{name}` is not supported here at {json_repr(value[name])}",
                field=f"structured_outputs.{name}",
                code="not_supported",
            )
    unknown = set(value) - set(STRUCTURED_KINDS) - set(STRUCTURED_NEUTRAL) - {"json_object"}
    if unknown:
        name = sorted(unknown)[0]
        raise UserError(f"unknown or unsupported field `structured_outputs.{name}`", field=f"structured_outputs.{name}")
    given = [k for k in (*STRUCTURED_KINDS, "json_object") if value.get(k) not in (None, False)]
    if len(given) != 1:
        raise UserError(
            "`structured_outputs` takes exactly one of json, regex, choice, grammar or json_object, "
            f"got {', '.join(given) or 'none'}",
            field="structured_outputs",
        )
    name = given[0]
    kind = "json_object" if name == "json_object" else STRUCTURED_KINDS[name]
    return make_constraint(kind, value[name], f"structured_outputs.{name}")


def constraint_of(body: dict, format_field: str = "response_format") -> Constraint | None:
    """The request's one constraint from `response_format` (or `text.format`) and `structured_outputs`."""
    if format_field == "text.format":
        text = body.get("text")
        if text is not None and not isinstance(text, dict):
            raise UserError('`text` must be an object like {"format": {"type": "text"}}', field="text")
        fmt = from_response_format((text or {}).get("format"), "text.format")
    else:
        fmt = from_response_format(body.get("response_format"))
    outputs = from_structured_outputs(body.get("structured_outputs"))
    if fmt is not None and outputs is not None:
        raise UserError(
            f"send either `{format_field}` or `structured_outputs`, not both (vLLM refuses both too)",
            field="structured_outputs",
        )
    constraint = fmt or outputs
    check_ending(constraint, body.get("ignore_eos"), body.get("min_tokens"), ("ignore_eos", "min_tokens"))
    return constraint
