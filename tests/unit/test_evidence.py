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


@pytest.mark.parametrize("file", SHIPPED)
def test_every_shipped_roofline_passes_its_check(file):
    """The recorder refuses a recording whose floors fail (below): every shipped roofline passes, so its
    points' verdicts are decided by their own evidence (steps, fastest against median), not by the floors."""
    for name, roof in rooflines(SHIPPED[file]).items():
        assert evidence.floor_problems(roof["points"]) == [], name
        assert evidence.FLOORS not in {evidence.point_evidence(p, True) for p in roof["points"]}


def test_the_shipped_why_batch_medians_and_fastest_steps_disagree_on_whether_batch_16_paid():
    """The figures the page's mixed sentence rests on (claims.js whyBatchClaim), recomputed here: by the
    fastest step batch 16 gave more than 5 % more than batch 8, by the median it did not."""
    points = SERVING["experiments"]["why_batch"]["result"]["points"]
    fastest = [p["batch"] * 1000 / p["step_ms"] for p in points]
    median = [p["batch"] * 1000 / p["step_ms_median"] for p in points]
    assert fastest[-1] > fastest[-2] * 1.05
    assert median[-1] < median[-2] * 1.05
    assert all(p["steps_measured"] >= 7 for p in points)  # 8 new tokens: 7 full-batch steps each


def test_the_recorder_refuses_a_recording_whose_floors_fail(tmp_path, capsys):
    trace = copy.deepcopy(SERVING)
    points = trace["experiments"]["why_batch"]["result"]["roofline"]["points"]
    one, two = (next(p for p in points if p.get("batch") == b) for b in (1, 2))
    one["kernel_ms"] = two["kernel_ms"] * 1.5  # more rows, less work: the old recording's fault
    out = tmp_path / "serving-trace.json"
    assert rec.write_checked(trace, out) == 1
    assert not out.exists()
    assert "the floor of the decode at 2 rows" in capsys.readouterr().err


def test_the_recorder_writes_a_recording_whose_floors_hold(tmp_path):
    trace = copy.deepcopy(SERVING)
    points = trace["experiments"]["why_batch"]["result"]["roofline"]["points"]
    next(p for p in points if p.get("batch") == 1)["kernel_ms"] *= 0.99  # still below batch 2's and its step
    out = tmp_path / "serving-trace.json"
    assert rec.write_checked(trace, out) == 0
    assert json.loads(out.read_text(encoding="utf-8")) == trace
