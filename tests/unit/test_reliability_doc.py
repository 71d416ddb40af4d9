"""docs/reliability.md says what the reliability tests do now: a case is called xfail (and listed
among the limits found) exactly when its test in tests/reliability is marked xfail."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RELIABILITY = ROOT / "docs" / "reliability.md"


def xfail_tests() -> set[str]:
    """Test functions in tests/reliability that carry an xfail mark."""
    marked = set()
    for path in (ROOT / "tests" / "reliability").glob("test_*.py"):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            match = re.match(r"def (test_\w+)", line)
            if not match:
                continue
            j = i - 1
            while j >= 0 and lines[j].startswith("@"):
                if "xfail" in lines[j]:
                    marked.add(match.group(1))
                j -= 1
    return marked


def test_reliability_doc_calls_a_case_xfail_only_when_its_test_is_marked_so():
    text = RELIABILITY.read_text()
    rows = re.findall(r"^\| (\w+) \| .*?\| `test_rel_\w+\.py::(test_\w+)` \| (.*) \|$", text, re.M)
    assert len(rows) >= 25
    marked = xfail_tests()
    for case, test, figure in rows:
        assert ("xfail" in figure.lower()) == (test in marked), f"case {case}: docs and {test} disagree on xfail"
    limits = text.split("## Limits found", 1)[1]
    for case, test, _ in rows:
        if test not in marked:
            assert f"case {case})" not in limits and "engine bug" not in limits, f"case {case} passes: not a limit"
