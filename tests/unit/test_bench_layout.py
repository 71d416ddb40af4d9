"""bench/ keeps one home for each piece of code: no block of six or more lines (whitespace normalised, blank
and comment-only lines left out) stands twice anywhere in the package, in one module or across two, and
no module passes 400 lines."""

from __future__ import annotations

from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
BLOCK = 6  # consecutive code lines that make a repeat
MAX_LINES = 400


def code_lines(text: str) -> list[tuple[int, str]]:
    """(line number, the line with its whitespace collapsed) for each line that is neither blank nor a comment."""
    lines = []
    for number, line in enumerate(text.splitlines(), 1):
        normal = " ".join(line.split())
        if normal and not normal.startswith(("#", "//")):
            lines.append((number, normal))
    return lines


def repeated_blocks(files: dict[str, str], size: int = BLOCK) -> list[str]:
    """Every block of `size` consecutive code lines that stands again, in the same file or another, as
    'first.py:10 ~ again.py:40' (the line numbers where each copy starts)."""
    first_seen: dict[tuple[str, ...], str] = {}
    repeats = []
    for name, text in sorted(files.items()):
        lines = code_lines(text)
        for start in range(len(lines) - size + 1):
            block = tuple(line for _, line in lines[start : start + size])
            where = f"{name}:{lines[start][0]}"
            if block in first_seen:
                repeats.append(f"{first_seen[block]} ~ {where}")
            else:
                first_seen[block] = where
    return repeats


def bench_sources() -> dict[str, str]:
    return {
        path.name: path.read_text(encoding="utf-8") for path in sorted(BENCH.glob("*.py")) + sorted(BENCH.glob("*.mjs"))
    }


def test_no_block_of_six_lines_repeats_inside_bench():
    sources = bench_sources()
    assert len(sources) > 5  # the package was read
    assert repeated_blocks(sources) == []


def test_the_check_catches_a_planted_duplicate():
    original = (BENCH / "report.py").read_text(encoding="utf-8")
    lines = [line for _, line in code_lines(original)]
    start = next(i for i, line in enumerate(lines) if line.startswith("def describe("))
    block = lines[start : start + BLOCK]
    # The copy is indented otherwise, spaced otherwise and has a blank line and a comment in the middle.
    planted = ["def elsewhere():", "    x = 1"] + ["        " + "  ".join(line.split(" ")) for line in block[:3]]
    planted += [
        "",
        "        # a comment between the copied lines",
        *("    " + line for line in block[3:]),
        "    return x",
    ]
    found = repeated_blocks({"report.py": original, "planted.py": "\n".join(planted)})
    assert len(found) == 1 and found[0].startswith("planted.py:3 ~ report.py:")
    # One line fewer than a block is not a repeat, and a block copied inside one module is one.
    assert repeated_blocks({"report.py": original, "planted.py": "\n".join(block[:-1])}) == []
    twice = "\n".join(block + ["pass"] + block)
    assert repeated_blocks({"one.py": twice}) == ["one.py:1 ~ one.py:8"]


def test_no_bench_module_passes_400_lines():
    long = {name: n for name, text in bench_sources().items() if (n := len(text.splitlines())) > MAX_LINES}
    assert long == {}
