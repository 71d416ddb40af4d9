"""The serving chapter's batch-invariance stage says only what the run it draws shows: its sentences
(static/js/serving/batch-invariance-math.js, run in node) against the shipped recording and against runs built to
take each other branch, and the recorders that make that recording (scripts/record_invariance_trace.py, and
scripts/record_serving_trace.py, which leaves the experiment to it)."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest

from scripts import record_invariance_trace as inv
from scripts import record_serving_trace as rec
from serving_experiments.contract import RECORDED_APART, check_response
from serving_experiments.registry import EXPERIMENTS

ROOT = Path(__file__).resolve().parents[2]
MATH = (ROOT / "static/js/serving/batch-invariance-math.js").as_uri()
RECORDING = json.loads((ROOT / "static/data/invariance-trace.json").read_text(encoding="utf-8"))
# A run in which one answer parted (request G, a near-tie): the 2026-12-01 recording, on transformers' forward,
# kept as a fixture for the parting branch the shipped quiet run did not take.
PARTED = json.loads((ROOT / "tests/data/invariance-parted.json").read_text(encoding="utf-8"))
SERVING = json.loads((ROOT / "static/data/serving-trace.json").read_text(encoding="utf-8"))

HARNESS = """
import * as M from MODULE;
const D = DATA;
const text = (c) => (c ? c.parts.map((p) => (typeof p === 'string' ? p : p[0])).join('') : null);
console.log(JSON.stringify((() => { return EXPR; })()));
"""


def js(tmp_path: Path, expr: str, data) -> object:
    """The value of a JS expression with the math module as `M`, `data` as `D` and `text(claim)` in scope."""
    script = tmp_path / "harness.mjs"
    script.write_text(
        HARNESS.replace("MODULE", json.dumps(MATH)).replace("DATA", json.dumps(data)).replace("EXPR", expr)
    )
    out = subprocess.run(["node", str(script)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def claims(tmp_path: Path, recording: dict) -> list[str]:
    """The stage's two sentences for a recording, as the page draws them (with its start and end load)."""
    return js(
        tmp_path,
        "M.CLAIMS.map((c) => text(c(D.experiment.result, D.experiment.machine, D.recorded_on)))",
        recording,
    )


def with_runs(change) -> dict:
    """The parted run with its runs changed by `change(result)`: a run that takes another branch."""
    built = copy.deepcopy(PARTED)
    change(built["experiment"]["result"])
    return built


# ---- the shipped recording -------------------------------------------------------------------------


def test_the_shipped_recording_is_a_quiet_run_of_the_experiments_defaults():
    on, machine = RECORDING["recorded_on"], RECORDING["experiment"]["machine"]
    assert check_response("batch_invariance", RECORDING["experiment"]) == []
    # at a load above the threads the step times are other processes' waits, not the mode's cost
    assert max(on["load_1m"], on["load_1m_end"]) <= machine["threads"]
    params = EXPERIMENTS["batch_invariance"].params
    result = RECORDING["experiment"]["result"]
    assert (result["requests"], result["new_tokens"]) == (params["requests"].default, params["new_tokens"].default)


SHIPPED_SENTENCES = [
    "In this run, on the default route, 8 of 8 answers came back from the batch as they were alone. Over the whole "
    "answers, 234 of 234 tokens were chosen with a probability that was not the same float as alone: the sums "
    "changed even where the choice held.",
    "With the mode on, 8 of 8 answers were the lone ones, every token's probability the same to the last bit. "
    "Its median step took ×3.38 the default's for a lone request (32.3 ms to 109 ms) and ×2.39 in the batch "
    "(57.2 ms to 136 ms): the padding rows, the row-by-row attention and the separate prompt passes cost time.",
]


def test_the_stages_sentences_for_the_shipped_recording(tmp_path):
    assert claims(tmp_path, RECORDING) == SHIPPED_SENTENCES


def test_the_stages_sentences_for_a_run_where_an_answer_parted(tmp_path):
    assert claims(tmp_path, PARTED) == [
        "In this run, on the default route, 7 of 8 answers came back from the batch as they were alone. Request G "
        "parted at token 27, where its two candidates were 0.0132 apart in logits alone and 0.0577 apart the other "
        "way in the batch: a near-tie (under 0.1 logits), tipped by a changed sum. The gap moved by 0.0709 logits, "
        "far more than reordering a float32 sum moves it: on the int4 route each linear layer of a decode step rounds "
        "its inputs to bfloat16 (8 significant bits), so a sum that changed in its lowest bits can round to the next bfloat16 "
        "value, a step of 0.4 to 0.8 % of its size, and the layers after carry that step forward. Counting each "
        "answer up to where "
        "it parted, if it did, 228 of 228 tokens were chosen with a probability that was not the same float as "
        "alone: the sums changed even where the choice held.",
        "With the mode on, 8 of 8 answers were the lone ones, every token's probability the same to the last bit. "
        "Its median step took ×2.59 the default's for a lone request (40.9 ms to 106 ms) and ×1.63 in the batch "
        "(72.5 ms to 118 ms): the padding rows, the row-by-row attention and the separate prompt passes cost time.",
    ]


def test_the_stages_cost_ratios_are_the_recordings_own(tmp_path):
    result = RECORDING["experiment"]["result"]
    runs = result["runs"]
    for key in ("alone", "batched"):
        ratio = runs["invariant"]["step_ms_median"][key] / runs["default"]["step_ms_median"][key]
        assert round(ratio, 3) == result["cost"][f"step_ms_median.{key}"]


# ---- each branch of the sentences, on runs built to take it -----------------------------------------


def unparted(result: dict) -> None:
    for r in result["runs"]["default"]["requests"]:
        r["parts_at"], r["same_answer"] = None, True
    result["runs"]["default"]["first_parting"] = None


def test_with_no_parting_the_count_is_over_the_whole_answers(tmp_path):
    default = claims(tmp_path, with_runs(unparted))[0]
    assert "8 of 8 answers came back" in default
    assert "Over the whole answers, 234 of 234 tokens were chosen with a probability that was not the same float" in (
        default
    )
    assert "parted" not in default and "parting" not in default


def test_no_size_of_the_difference_is_claimed(tmp_path):
    # only float equality is recorded, so the sentence says the float differed, never by how much
    for recording in (RECORDING, PARTED, with_runs(unparted)):
        assert all("last bits" not in sentence for sentence in claims(tmp_path, recording))


def test_a_parted_answer_with_same_floats_makes_the_count_a_lower_bound(tmp_path):
    def same_after_parting(result):
        result["runs"]["default"]["requests"][6]["same_prob_tokens"] = 3  # G parts at 26; where they fell is unknown

    built = with_runs(same_after_parting)
    bits = js(tmp_path, "M.sameBits(D.experiment.result.runs.default)", built)
    assert bits == {"same": 3, "compared": 228, "exact": False}
    assert "at least 225 of 228 tokens" in claims(tmp_path, built)[0]
    assert js(tmp_path, "M.sameBits(D.experiment.result.runs.default).exact", RECORDING) is True


def test_a_loaded_recording_names_its_load_as_it_began_and_ended_and_claims_no_cost(tmp_path):
    loaded = copy.deepcopy(RECORDING)
    loaded["recorded_on"].update(load_1m=15.97, load_1m_end=10.91)
    mode = claims(tmp_path, loaded)[1]
    assert mode.endswith(
        ", but at a load of 15.97 → 10.91 on 2 threads these times are mostly the other processes' share of the "
        "machine, not the mode's cost."
    )
    assert "cost time" not in mode


def test_a_quiet_run_where_the_mode_was_faster_does_not_call_it_a_cost(tmp_path):
    def faster(result):
        for key in ("alone", "batched"):
            result["runs"]["invariant"]["step_ms_median"][key] = result["runs"]["default"]["step_ms_median"][key] / 2

    mode = claims(tmp_path, with_runs(faster))[1]
    assert "×0.50 the default's" in mode and mode.endswith("; the mode was not slower in this run.")
    assert "cost time" not in mode


def test_a_live_answer_is_judged_by_its_own_load(tmp_path):
    live = copy.deepcopy(RECORDING)
    live["recorded_on"] = None
    live["experiment"]["machine"]["load_1m"] = 3.5
    assert "at a load of 3.50 on 2 threads" in claims(tmp_path, live)[1]


def test_tokens_per_second_keep_the_digits_that_tell_runs_apart(tmp_path):
    shown = js(tmp_path, "[0.092, 0.14, 8.768, 21.943, 75.753, NaN].map(M.rateText)", None)
    assert shown == ["0.092", "0.140", "8.77", "21.9", "75.8", "–"]


# ---- the recorders -------------------------------------------------------------------------------


def test_the_serving_recorder_leaves_experiments_recorded_apart_to_their_own_file():
    assert rec.names_to_record(None) == [n for n in EXPERIMENTS if n not in RECORDED_APART]
    assert "batch_invariance" not in rec.names_to_record(None)
    assert rec.names_to_record(["pricing"]) == ["pricing"]
    with pytest.raises(SystemExit, match=r"batch_invariance is recorded apart, in static/data/invariance-trace\.json"):
        rec.names_to_record(["pricing", "batch_invariance"])


def test_the_recorder_copies_only_a_run_whose_date_and_load_are_its_own():
    body = PARTED["experiment"]
    first = {"machine": {**body["machine"], "load_1m": 0.5}}
    trace = {"recorded_on": {**PARTED["recorded_on"], "load_1m": 0.4}, "experiments": {"why_batch": first}}
    trace["recorded_on"].pop("copied_from")
    last = {**trace, "experiments": {"why_batch": first, "batch_invariance": body}}
    copied = inv.copied_from_serving_trace(last, "x.json")
    assert (copied["recorded_on"]["load_1m"], copied["recorded_on"]["load_1m_end"]) == (0.5, body["machine"]["load_1m"])
    not_last = {**trace, "experiments": {"batch_invariance": body, "why_batch": first}}
    with pytest.raises(ValueError, match="not the last experiment"):
        inv.copied_from_serving_trace(not_last, "x.json")
    merged = copy.deepcopy(last)
    merged["recorded_on"]["merged"] = [{"experiments": ["batch_invariance"]}]
    with pytest.raises(ValueError, match="not the last experiment"):
        inv.copied_from_serving_trace(merged, "x.json")
