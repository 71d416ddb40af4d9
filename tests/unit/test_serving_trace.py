"""The recorded serving trace (static/data/serving-trace.json), which the chapter shows before the
model is ready: it fits the experiments contract (serving_experiments.contract.check_trace, the one
validator the front-end tests reuse), was recorded on the real model, and its derived numbers agree
with the measurements they come from."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from serving_experiments.contract import check_trace
from serving_experiments.experiments.why_batch import BATCHES

TRACE = Path(__file__).resolve().parents[2] / "static" / "data" / "serving-trace.json"


@pytest.fixture(scope="module")
def trace() -> dict:
    return json.loads(TRACE.read_text())


def test_trace_fits_the_contract(trace):
    assert check_trace(trace) == []
    assert "fake" not in trace["recorded_on"]["model"]  # recorded on the real model, not the test stand-in


def test_the_validator_refuses_a_broken_trace(trace):
    broken = copy.deepcopy(trace)
    del broken["experiments"]["batching"]["result"]["runs"]["static"]
    broken["experiments"]["speculative"]["result"]["cases"][0]["tokens"] += 1
    broken["experiments"]["why_batch"]["result"]["points"].pop()
    problems = check_trace(broken)
    assert any("batching.runs" in p and "static" in p for p in problems)
    assert any("accepted + bonus" in p for p in problems)
    assert any("why_batch: batches" in p for p in problems)


def test_derived_numbers_agree_with_their_measurements(trace):
    ex = {name: body["result"] for name, body in trace["experiments"].items()}
    for point in ex["why_batch"]["points"]:
        assert point["per_user_tps"] == pytest.approx(1000 / point["step_ms"], rel=1e-3)
        assert point["aggregate_tps"] == pytest.approx(point["batch"] * point["per_user_tps"], rel=1e-3)
    assert [p["batch"] for p in ex["why_batch"]["points"]] == list(BATCHES)
    pricing = ex["pricing"]
    assert pricing["ratio"] == pytest.approx(pricing["decode_ms_per_token"] / pricing["prefill_ms_per_token"], rel=1e-2)
    paged = ex["paged_blocks"]
    assert paged["used_bytes"] <= paged["reserved_bytes"] <= paged["pool_bytes"]
    for case in ex["speculative"]["cases"]:
        assert case["identical"] == (case["diverged_at"] is None)
        assert sum(s["accepted"] for s in case["steps"]) == case["accepted"]
    for mode, run in ex["batching"]["runs"].items():
        workload = {w["request"]: w["max_new_tokens"] for w in ex["batching"]["workload"]}
        decodes = {r: sum(s["cells"][r] == "decode" for s in run["steps"]) for r in workload}
        assert all(decodes[r] <= workload[r] - 1 for r in workload), mode  # the first token comes from prefill
        assert sum(decodes.values()) + len(workload) == run["tokens"], mode  # the grid accounts for every token
