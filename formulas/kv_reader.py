"""How the config reader reads one value: the alias table, the bounds, and the one way both twins show a value in a
message (static/js/calculator/kv-reader.js is the twin, so a message reads the same in either). Every value used is
recorded with its key, every error names the key it is about."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from pathlib import Path
from typing import Any

# The repository keeps static/ at the top; an installed copy keeps it inside the app package (pyproject.toml).
_TABLE_PATHS = [
    Path(__file__).resolve().parents[1] / where / "data/config-keys.json" for where in ("static", "app/static")
]
TABLE = json.loads(next(p for p in _TABLE_PATHS if p.exists()).read_text(encoding="utf-8"))
BIG = 2**30  # larger than any real layer count, head count or window: past it a value is a typo or a test
SHOWN_CHARS = 40  # a string in a message is cut here: a 2 MB value must not become a 2 MB message


def integral(v: Any) -> int | None:
    """A JSON whole number (32 or 32.0, as JavaScript reads both), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not (math.isfinite(v) and v == int(v)):
        return None
    return int(v)


def js_number(v: float | int) -> str:
    """A number as JavaScript's String() writes it (ECMAScript Number::toString on the double): whole numbers in
    full below 10^21, exponent form past it, the same shortest digits either way."""
    try:
        x = float(v)
    except OverflowError:  # a whole number past the doubles: JSON.parse reads it as Infinity
        x = math.inf if v > 0 else -math.inf
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    if x == 0:
        return "0"
    sign = "-" if x < 0 else ""
    t = Decimal(repr(abs(x))).normalize().as_tuple()
    digits = "".join(map(str, t.digits))
    k, n = len(digits), t.exponent + len(digits)  # x = 0.digits × 10^n
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return f"{sign}{digits[:n]}.{digits[n:]}"
    if -6 < n <= 0:
        return f"{sign}0.{'0' * -n}{digits}"
    e = n - 1
    mantissa = digits if k == 1 else f"{digits[0]}.{digits[1:]}"
    return f"{sign}{mantissa}e{'+' if e >= 0 else '-'}{abs(e)}"


def shown(v: Any) -> str:
    """A value as a message shows it: numbers as JavaScript writes them, strings quoted and cut, containers by
    their size (never their contents: those may be huge or nested thousands deep)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return js_number(v)
    if isinstance(v, str):
        cut = v[:SHOWN_CHARS]
        return json.dumps(cut, ensure_ascii=False) + ("…" if len(v) > SHOWN_CHARS else "")
    if isinstance(v, list):
        return f"a list of {len(v):,}"
    return "an object"


def same_value(a: Any, b: Any) -> bool:
    """Two aliases' values agree as JSON reads them (32 and 32.0 are one number; true is not 1)."""
    numbers = [isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b)]
    if all(numbers):
        return js_number(a) == js_number(b)
    return not any(numbers) and json.dumps(a) == json.dumps(b)


def families_text(families: Any) -> str:
    return "every family" if families == "*" else ", ".join(families)


class Reader:
    """One config.json being read: where its text part is, what was used, what is wrong, what is flagged."""

    def __init__(self, config: dict, family: str):
        text = config.get("text_config")
        self.top = config
        self.cfg = text if isinstance(text, dict) else config
        self.prefix = "text_config." if isinstance(text, dict) else ""
        self.family = family
        self.used: list[dict] = []
        self.errors: list[dict] = []
        self.flags: list[dict] = []

    def error(self, key: str, message: str) -> None:
        self.errors.append({"field": self.prefix + key, "message": message})

    def flag(self, key: str, message: str) -> None:
        self.flags.append({"field": self.prefix + key, "message": message})

    def get(self, key: str) -> Any:
        """The file's value at `key` ("a.b" reads inside an object), None when absent or null."""
        node: Any = self.cfg
        for part in key.split("."):
            if not isinstance(node, dict):
                return None
            node = node.get(part)
        return node

    def has(self, key: str) -> bool:
        return self.get(key) is not None

    def note(self, name: str, key: str, value: Any, default: str = "") -> None:
        u = {"name": name, "key": self.prefix + key, "value": value}
        if default:
            u["default"] = default
        self.used.append(u)

    def check(self, key: str, v: Any, lo: int, hi: int) -> int | None:
        n = integral(v)
        if n is None or not lo <= n <= hi:
            self.error(key, f"must be a whole number from {lo:,} to {hi:,} (got {shown(v)})")
            return None
        return n

    def whole(self, key: str, name: str, lo: int = 1, hi: int = BIG, default: Any = None, why: str = "") -> Any:
        """An integer read from `key` and recorded as used; a missing key takes `default` only when `why` says
        whose default it is, else it is an error."""
        v = self.get(key)
        if v is None:
            if why:
                self.note(name, key, default, why)
                return default
            self.error(key, f"missing: needed for {name}")
            return None
        n = self.check(key, v, lo, hi)
        if n is not None:
            self.note(name, key, n)
        return n

    def known_for_family(self, key: str, families: Any) -> None:
        if families != "*" and self.family and self.family not in families:
            self.flag(key, f"read, though this calculator knows {key} only in {families_text(families)} configs")

    def fact(self, fact: str, lo: int = 1, hi: int = BIG, default: Any = None, why: str = "", skip: tuple = ()) -> Any:
        """One fact from the first alias the file sets (config-keys.json order); aliases that disagree are an
        error, an alias outside its families is flagged, a missing fact takes the family's transformers default."""
        spec = TABLE["facts"][fact]
        present = [a for a in spec["aliases"] if a["key"] not in skip and self.has(a["key"])]
        if not present:
            family_default = TABLE["defaults"].get(self.family, {})
            standard = spec["standard"]
            if standard in family_default:
                self.note(spec["name"], standard, family_default[standard], family_default["source"])
                return family_default[standard]
            if why:
                self.note(spec["name"], standard, default, why)
                return default
            keys = " / ".join(a["key"] for a in spec["aliases"])
            self.error(standard, f"missing: needed for {spec['name']} (looked for {keys})")
            return None
        values = [(a["key"], self.get(a["key"])) for a in present]
        if any(not same_value(values[0][1], v) for _, v in values[1:]):
            said = " and ".join(f"{k} = {shown(v)}" for k, v in values)
            self.error(present[0]["key"], f"{said} disagree about the {spec['name']}")
            return None
        first = present[0]
        self.known_for_family(first["key"], first["families"])
        return self.whole(first["key"], spec["name"], lo, hi)
