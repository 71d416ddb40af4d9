"""What a request's answer must match, as it crosses the engine's door: a `Constraint` (a JSON object,
a JSON schema, a regex, one of some choices, or an EBNF grammar) with its spec checked for shape here,
the one home of that check for the WebSocket's `constraint` field and the OpenAI fields alike
(app/openai/structured.py). Compiling it into a grammar is the engine's (model_runner/shared/constraints.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from model_runner.protocol.errors import UserError
from model_runner.protocol.fields import json_repr

KINDS = ("json_object", "json_schema", "regex", "choice", "grammar")
MAX_CHOICES = 1000
WIRE_FIELDS = ("kind", "spec")


@dataclass(frozen=True)
class Constraint:
    """`spec`: the schema as JSON text in the client's own key order (xgrammar emits the properties in
    the order the schema lists them, and a remote engine forwards it as sent), the regex, the EBNF
    grammar, the choices as a JSON list, or "" for any JSON object; `field`: the request field it
    came from, for errors."""

    kind: str
    spec: str
    field: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "spec": self.spec}


def make_constraint(kind: str, spec: Any, field: str) -> Constraint:
    """A Constraint from a kind and its spec as a client sends it (a schema object or its JSON text,
    a list of choices, a regex or grammar string); UserError naming `field` when the spec is misshapen."""
    if kind == "json_object":
        return Constraint(kind, "", field)
    if kind == "json_schema":
        return Constraint(kind, _schema_text(spec, field), field)
    if kind == "choice":
        if not isinstance(spec, list) or not spec or not all(isinstance(c, str) and c for c in spec):
            raise UserError(f"`{field}` must be a non-empty list of non-empty strings", field=field)
        if len(spec) > MAX_CHOICES:
            raise UserError(f"`{field}` may hold at most {MAX_CHOICES} strings, got {len(spec)}", field=field)
        return Constraint(kind, json.dumps(spec, ensure_ascii=False), field)
    if kind in ("regex", "grammar"):
        if not isinstance(spec, str) or not spec:
            raise UserError(f"`{field}` must be a non-empty string", field=field)
        return Constraint(kind, spec, field)
    raise UserError(f"a constraint's kind must be one of {', '.join(KINDS)}, got {json_repr(kind)}", field=field)


def check_ending(constraint: Constraint | None, ignore_eos: Any, min_tokens: Any, names: tuple[str, str]) -> None:
    """Refuse `ignore_eos` and a minimum length beside a constraint (`names`: how the request calls them):
    the grammar decides where the answer may end, and the end tokens are all it allows once it is complete."""
    if constraint is None:
        return
    for name, value in zip(names, (ignore_eos, min_tokens)):
        if value:
            raise UserError(
                f"`{name}` cannot run with a constraint: the grammar decides where the answer may end", field=name
            )


def _schema_text(schema: Any, field: str) -> str:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise UserError(f"`{field}` is not valid JSON: {exc}", field=field) from None
    if not isinstance(schema, (dict, bool)):
        raise UserError(f"`{field}` must be a JSON schema object, got {json_repr(schema)}", field=field)
    # No sort_keys: the order of `properties` is the order of the answer's keys.
    return json.dumps(schema, ensure_ascii=False)


def from_wire(raw: Any) -> Constraint | None:
    """The `generate` frame's `constraint`: {"kind": …, "spec": …} (no spec for json_object), or absent."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise UserError(
            '`constraint` must be an object like {"kind": "choice", "spec": ["yes", "no"]}', field="constraint"
        )
    for name in raw:
        if name not in WIRE_FIELDS:
            raise UserError(f"unknown field {json_repr(f'constraint.{name}')}", field=f"constraint.{name}")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise UserError(
            f"`constraint.kind` must be one of {', '.join(KINDS)}, got {json_repr(kind)}", field="constraint.kind"
        )
    return make_constraint(kind, raw.get("spec"), "constraint.spec")
