"""The page's number formats (static/js/shared/format.js) in Python, so browser tests can work out the exact
text a figure must show from the recording it draws."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal


def fixed(x: float, digits: int) -> str:
    """JavaScript's toFixed: the exact binary value rounded half up (Python's format rounds half to even)."""
    return str(Decimal(x).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))


def fmt_ms(ms: float) -> str:
    """format.js formatMs: precision follows the size."""
    if ms >= 10000:
        return f"{fixed(ms / 1000, 1)} s"
    if ms >= 100:
        return f"{int(Decimal(ms).quantize(Decimal(1), rounding=ROUND_HALF_UP)):,} ms"
    return f"{fixed(ms, 1)} ms" if ms >= 10 else f"{fixed(ms, 2)} ms"
