"""`kvscope bench --structured` on the fake model: the run writes JSON that passes its schema, with a
constrained / plain step ratio for each case at 1 and N clients (each repeat's ratio its own phases'
medians, the spread over them), xgrammar's compile times and the machine's load before and after, and every
constrained answer parses as its constraint promised. No speed is asserted: only that the figures exist and agree."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

from bench.report import validate
from bench.structured import CASES, CHOICES, SCHEMA_OUT, parses
from kvscope.cli import main

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def structured_report(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "structured.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["bench", "--structured", "--model", "fake", "--concurrency", "3", "--repeats", "2"]
                    + ["--json", str(path)])  # fmt: skip
    return code, json.loads(path.read_text()), printed.getvalue()


def test_the_structured_run_writes_json_that_passes_its_schema(structured_report):
    code, report, _ = structured_report
    assert code == 0 and validate(report, SCHEMA_OUT) == []
    assert report["settings"]["concurrency"] == [1, 3] and report["settings"]["repeats"] == 2
    machine = report["machine"]
    assert machine["torch_threads"] >= 1 and machine["cpu_count"] >= 1
    # which CPU and kernels the figures are of: its model name, its vector flags, torch's capability
    assert machine["cpu"] and machine["capability"] == torch.backends.cpu.get_cpu_capability()
    assert isinstance(machine["cpu_flags"], list)
    assert "load_average_start" in machine and "load_average_end" in machine


def test_each_case_at_each_concurrency_has_a_ratio_from_its_own_phases(structured_report):
    _, report, _ = structured_report
    rows = report["cases"]
    assert sorted((r["case"], r["clients"]) for r in rows) == sorted((c, n) for c in CASES for n in (1, 3))
    for r in rows:
        assert len(r["ratios"]) == 2
        for ratio, plain, constrained in zip(r["ratios"], r["plain_step_ms"], r["constrained_step_ms"]):
            assert plain > 0 and ratio == pytest.approx(constrained / plain, abs=1e-4)
        assert r["ratio"]["min"] <= r["ratio"]["median"] <= r["ratio"]["max"]
        assert report["ratios"][f"{r['case']}_{r['clients']}"]["value"] == r["ratio"]["median"]


def test_the_compile_times_and_the_mask_alone_are_reported_for_each_case(structured_report):
    _, report, printed = structured_report
    assert set(report["compile_ms"]) == {"compiler_ms", *CASES}
    # the mask replayed over every pilot answer's tokens (3 questions, each answer at least 2 tokens)
    assert all(report["mask_alone"][case]["steps"] >= 3 * 2 for case in CASES)
    assert all(ms > 0 for ms in report["compile_ms"].values())
    assert "constrained / plain" in printed and "torch threads" in printed


def test_every_constrained_answer_parses(structured_report):
    _, report, _ = structured_report
    for case, counted in report["answers"].items():
        assert counted["answers"] == (1 + 3) * 2 and counted["parsed"] == counted["answers"], counted["unparsed"]
    assert report["totals"]["requests"] == 2 * sum(a["answers"] for a in report["answers"].values())  # + plain


def test_the_parse_check_refuses_what_the_constraint_did_not_promise():
    good = {"topic": "nature", "difficulty": "easy", "needs_a_picture": False}
    assert parses("json_schema", json.dumps(good))
    assert not parses("json_schema", json.dumps(good)[:-1])  # cut by max_tokens: a prefix, not JSON
    assert not parses("json_schema", json.dumps({**good, "topic": "cats"}))
    assert not parses("json_schema", json.dumps({"topic": "nature"}))
    assert parses("choice", CHOICES[0]) and not parses("choice", CHOICES[0] + ".")
