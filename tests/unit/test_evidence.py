"""A verdict needs its evidence (serving_experiments/evidence.py): the golden cases its JS twin reads too, the
rule applied to every shipped recording with a roofline, and the recorder refusing a recording whose floors
fail (scripts/record_serving_trace.py writes nothing then)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from scripts import record_serving_trace as rec
from serving_experiments import evidence

ROOT = Path(__file__).resolve().parents[2]
CASES = json.loads((ROOT / "tests/data/evidence-cases.json").read_text(encoding="utf-8"))["cases"]
SERVING = json.loads((ROOT / "static/data/serving-trace.json").read_text(encoding="utf-8"))
SHIPPED = {
    "serving-trace.json": SERVING,
    "invariance-trace.json": json.loads((ROOT / "static/data/invariance-trace.json").read_text(encoding="utf-8")),
}

pytestmark = pytest.mark.unit


def as_rows(problems: list[dict]) -> list[list]:
    return [[q["kind"], q["phase"], q["rows"], q.get("after")] for q in problems]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_golden_cases(case):
    problems = evidence.floor_problems(case["points"])
    busy = evidence.loaded(*case["loaded"])
    assert as_rows(problems) == case["problems"]
    assert [evidence.point_evidence(p, not problems, busy) for p in case["points"]] == case["evidence"]
    for q in problems:  # every problem can be said with its figures
        assert "ms" in evidence.problem_words(q, case["points"])


def rooflines(trace: dict) -> dict[str, dict]:
    """Every roofline in a recording: one experiment's answer (`experiment`) or several (`experiments`)."""
    bodies = trace.get("experiments") or {trace["experiment"]["name"]: trace["experiment"]}
    return {
        name: body["result"]["roofline"]
        for name, body in bodies.items()
        if isinstance(body.get("result"), dict) and "roofline" in body["result"]
    }


# The floor problems each shipped roofline has. The one shipped roofline was recorded before the check: its
# 2-row floor is below its 1-row floor, so none of its verdicts is carried (the page says so:
# tests/browser/test_claims_follow_recordings.py); a re-recording must pass, or the recorder refuses it.
KNOWN = {"serving-trace.json": {"why_batch": [["falls", "decode", 2, 1]]}, "invariance-trace.json": {}}


@pytest.mark.parametrize("file", SHIPPED)
def test_every_shipped_roofline_is_checked_and_the_failing_one_is_known(file):
    found = {name: as_rows(evidence.floor_problems(roof["points"])) for name, roof in rooflines(SHIPPED[file]).items()}
    assert found == KNOWN[file]
    for name, roof in rooflines(SHIPPED[file]).items():
        consistent = not found[name]
        assert {evidence.point_evidence(p, consistent) for p in roof["points"]} == {evidence.FLOORS}


def test_the_shipped_why_batch_medians_and_fastest_steps_disagree_on_where_batching_stopped_paying():
    """The figures the page's mixed sentence rests on (claims.js whyBatchClaim), recomputed here."""
    points = SERVING["experiments"]["why_batch"]["result"]["points"]
    fastest = [p["batch"] * 1000 / p["step_ms"] for p in points]
    median = [p["batch"] * 1000 / p["step_ms_median"] for p in points]
    assert fastest[-1] < fastest[-2]  # by the fastest step, batch 16 gave less than batch 8
    assert median[-1] > median[-2] * 1.05  # by the median, it gave more than 5 % more
    assert all(p["steps_measured"] < 7 for p in points)  # three steps each: the thin evidence the issue named


def test_the_recorder_refuses_a_recording_whose_floors_fail(tmp_path, capsys):
    out = tmp_path / "serving-trace.json"
    assert rec.write_checked(copy.deepcopy(SERVING), out) == 1
    assert not out.exists()
    assert (
        "the floor of the decode at 2 rows (19.94 ms) is below the floor at 1 row (23.02 ms)" in capsys.readouterr().err
    )


def test_the_recorder_writes_a_recording_whose_floors_hold(tmp_path):
    trace = copy.deepcopy(SERVING)
    points = trace["experiments"]["why_batch"]["result"]["roofline"]["points"]
    next(p for p in points if p.get("batch") == 1)["kernel_ms"] = 19.0  # below batch 2's 19.94
    out = tmp_path / "serving-trace.json"
    assert rec.write_checked(trace, out) == 0
    assert json.loads(out.read_text(encoding="utf-8")) == trace
