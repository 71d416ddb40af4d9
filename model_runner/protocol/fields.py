"""The one field checker: an integer, a number, a choice or a flag within its limits, or a UserError
whose message names the field and the limit, worded the same wherever a request is parsed."""

from __future__ import annotations

import math
from typing import Any

from model_runner.protocol.errors import UserError


def is_int(value: Any) -> bool:
    """An integer, and not a bool (JSON's true is no count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float, and not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def json_repr(value: Any) -> str:
    """A short rendering of a client's value for an error message (long strings cut)."""
    text = repr(value) if not isinstance(value, str) else '"' + value[:40] + ('…"' if len(value) > 40 else '"')
    return text[:60]


def check_int(field: str, value: Any, lo: int, hi: int, *, or_else: str = "") -> int:
    """`value` as an integer in [lo, hi]; `or_else` names what else the caller accepts (", or null …")."""
    if not is_int(value) or not lo <= value <= hi:
        limit = f"an integer between {lo} and {hi}{or_else}"
        raise UserError(f"`{field}` must be {limit}, got {json_repr(value)}", field=field)
    return value


def check_number(field: str, value: Any, lo: float, hi: float, *, low_open: bool = False) -> float:
    """`value` as a number in [lo, hi], or in (lo, hi] with `low_open`."""
    inside = is_number(value) and (lo < value if low_open else lo <= value) and value <= hi
    if not inside:
        bounds = f"in ({lo:g}, {hi:g}]" if low_open else f"between {lo:g} and {hi:g}"
        raise UserError(f"`{field}` must be a number {bounds}, got {json_repr(value)}", field=field)
    return value


def check_choice(field: str, value: Any, choices: tuple) -> Any:
    """`value` as one of `choices`."""
    if not isinstance(value, (str, int, float, bool, type(None))) or value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise UserError(f"`{field}` must be one of {allowed}, got {json_repr(value)}", field=field)
    return value


def check_bool(field: str, value: Any) -> bool:
    """`value` as true or false."""
    if not isinstance(value, bool):
        raise UserError(f"`{field}` must be true or false, got {json_repr(value)}", field=field)
    return value


def int_field(data: dict, name: str, lo: int, hi: int, default: int | None, label: str | None = None) -> int | None:
    """data[name] checked as an integer in [lo, hi] (named `label` in the message); `default` when absent or null."""
    if data.get(name) is None:
        return default
    return check_int(label or name, data[name], lo, hi)
