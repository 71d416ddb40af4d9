"""Structured outputs as vLLM takes them, read into one `Constraint` (model_runner/shared/constraints.py):
OpenAI's `response_format` (`json_object`, or `json_schema` with its `schema`), vLLM's
`structured_outputs` (exactly one of `json`, `regex`, `choice`, `grammar`, `json_object`), and the
Responses API's `text.format`. On the built-in engine the constraint is compiled here, so a schema
xgrammar refuses is a 400 naming the field before anything runs; a remote engine forwards it."""

from __future__ import annotations

import json
from typing import Any

from model_runner.protocol.errors import UserError
from model_runner.protocol.fields import json_repr
from model_runner.shared.constraints import Constraint, compiled

FIELDS = ("response_format", "structured_outputs")  # the request fields read here (chat and completions)
STRUCTURED_KINDS = {"json": "json_schema", "regex": "regex", "choice": "choice", "grammar": "grammar"}
# vLLM's tuning switches: accepted at the values that change nothing here.
STRUCTURED_NEUTRAL = {
    "disable_fallback": (None, False, True),
    "disable_any_whitespace": (None, False, True),  # answers are compact JSON either way
    "disable_additional_properties": (None, False),
    "whitespace_pattern": (None,),
}
MAX_CHOICES = 1000


def _schema_text(schema: Any, field: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise UserError(f"`{field}` is not valid JSON: {exc}", field=field) from None
    if not isinstance(schema, (dict, bool)):
        raise UserError(f"`{field}` must be a JSON schema object, got {json_repr(schema)}", field=field)
    return json.dumps(schema, sort_keys=True, ensure_ascii=False)


def from_response_format(value: Any, where: str = "response_format") -> Constraint | None:
    """OpenAI's `response_format` (also the Responses API's `text.format`, whose schema sits beside
    `type` rather than under `json_schema`)."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json_object", "", where)
    if kind == "json_schema":
        inner = value if where != "response_format" else value.get("json_schema")
        inner_where = where if where != "response_format" else f"{where}.json_schema"
        if not isinstance(inner, dict) or "schema" not in inner:
            raise UserError(
                f"`{inner_where}.schema` is required for a json_schema format", field=f"{inner_where}.schema"
            )
        return Constraint(
            "json_schema", _schema_text(inner["schema"], f"{inner_where}.schema"), f"{inner_where}.schema"
        )
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
    where = f"structured_outputs.{name}"
    if name == "json_object":
        return Constraint("json_object", "", where)
    if name == "json":
        return Constraint("json_schema", _schema_text(value[name], where), where)
    if name == "choice":
        choices = value[name]
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
            raise UserError(f"`{where}` must be a non-empty list of strings", field=where)
        if len(choices) > MAX_CHOICES:
            raise UserError(f"`{where}` may hold at most {MAX_CHOICES} strings, got {len(choices)}", field=where)
        return Constraint("choice", json.dumps(choices, ensure_ascii=False), where)
    if not isinstance(value[name], str) or not value[name]:
        raise UserError(f"`{where}` must be a non-empty string", field=where)
    return Constraint(STRUCTURED_KINDS[name], value[name], where)


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
    if constraint is not None:
        for name in ("ignore_eos", "min_tokens"):
            if body.get(name):
                raise UserError(
                    f"`{name}` cannot run with a constraint: the grammar decides where the answer may end",
                    field=name,
                )
    return constraint


def checked(constraint: Constraint | None, model: Any) -> Constraint | None:
    """On the built-in engine (its tokenizer is here), compile it now: what xgrammar refuses is a 400."""
    if constraint is not None and model.tokenizer is not None and model.vocab:
        compiled(constraint, model.tokenizer, model.vocab)
    return constraint
