"""`kvscope bench --batching --class` on the fake model: the report's shape (checked against its
schema), ratios taken from the runs of the same repeat, greedy equality counted request by request,
and the class scenario's fields. No timing assertions: the fake model's times mean nothing."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from bench import baselines, class_scenario
from bench.batching_report import SCHEMA
from bench.report import greedy_equality, run_summary, validate
from kvscope.cli import main
from model_runner.protocol.metrics import percentile


def test_greedy_equality_counts_identical_requests_and_where_others_differ():
    got = [[1, 2, 3], [1, 2, 4], [5], None, [1, 2]]
    ref = [[1, 2, 3], [1, 2, 3], [5], [7], [1, 2, 3]]
    eq = greedy_equality(got, ref)
    assert (eq["identical"], eq["compared"]) == (2, 4)  # the request that did not complete is not compared
    assert eq["first_diff"] == [
        {"request": 1, "token": 2},
        {"request": 4, "token": 2},
    ]  # a shorter answer differs at its end
    assert greedy_equality([], []) == {"identical": 0, "compared": 0, "first_diff": []}


def test_run_summary_counts_completed_tokens_over_the_wall():
    from bench.clients import RequestRecord

    done = RequestRecord("a", outcome="completed", token_ids=[1, 2, 3, 4])
    failed = RequestRecord("b", outcome="error", token_ids=[9])
    s = run_summary([done, failed], 2.0, {"steps": 5, "preemptions": 0, "prefix_hit_tokens": 0})
    assert (s["requests"], s["completed"], s["output_tokens"], s["tokens_per_s"], s["steps"]) == (2, 1, 4, 2.0, 5)
    assert s["totals"]["errors"] == 1


@pytest.fixture(scope="module")
def batching_report(tmp_path_factory):
    """One small run; transformers' generate_batch (which the scripted fake model lacks) is stood in
    for by the bare loop, one prompt after another, so its side of the report is filled too."""
    path = tmp_path_factory.mktemp("bench") / "batching.json"
    printed = io.StringIO()
    calls: list[int] = []

    def fake_generate_batch(model, prompts, max_new, eos, num_blocks, block_size, max_batch_tokens):
        calls.append(len(prompts))
        runs = [baselines.bare_greedy_loop(model, p, max_new, eos) for p in prompts]
        span = max(sum(r.end - r.start for r in runs), 1e-6)
        return baselines.BatchRun([r.token_ids for r in runs], span, span + 0.5)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(baselines, "generate_batch_unavailable", lambda model: None)
        mp.setattr(baselines, "hf_generate_batch", fake_generate_batch)
        mp.setattr(
            class_scenario,
            "MIX",
            (
                ("short prompt, short answer", 40, 3),
                ("short prompt, long answer", 40, 10),
                ("long prompt, short answer", 120, 3),
                ("long prompt, long answer", 120, 10),
            ),
        )
        with contextlib.redirect_stdout(printed):
            code = main(
                [
                    "bench",
                    "--model",
                    "fake",
                    "--batching",
                    "--class",
                    "--prompt-lens",
                    "40",
                    "--output-lens",
                    "6",
                    "--concurrency",
                    "2,3",
                    "--repeats",
                    "2",
                    "--arrival-s",
                    "0.2",
                    "--seed",
                    "7",
                    "--json",
                    str(path),
                    "--no-progress",
                ]
            )
    return code, json.loads(path.read_text()), printed.getvalue(), calls


def test_report_passes_its_schema_and_counts_every_request(batching_report):
    code, report, _, calls = batching_report
    assert code == 0
    assert validate(report, SCHEMA) == []
    assert report["kind"] == "kvscope-bench-batching" and report["mode"] == "in-process"
    assert report["command"].startswith("kvscope bench --batching --class --model fake")
    assert report["settings"]["concurrency"] == [2, 3] and report["settings"]["repeats"] == 2
    assert report["machine"]["load_average_start"] is not None and "load_average_end" in report["machine"]
    # engine requests: (2 + 3) clients x 2 repeats x (batched + serial) + 16 x 2 scenarios x 2 modes
    assert report["totals"]["requests"] == 5 * 2 * 2 + 16 * 2 * 2 == report["totals"]["completed"]
    assert calls == [2, 2, 2, 3, 3]  # warm-up, then each repeat at each size


def test_each_ratio_comes_from_the_runs_of_its_own_repeat(batching_report):
    _, report, _, _ = batching_report
    rows = report["throughput"]
    assert [(r["clients"], r["repeat"]) for r in rows] == [(2, 0), (2, 1), (3, 0), (3, 1)]
    assert rows[0]["order"] == ["batched", "serial", "hf"] and rows[1]["order"] == ["serial", "hf", "batched"]
    for r in rows:
        b, s, hf = r["batched"], r["serial"], r["hf"]
        assert b["requests"] == s["requests"] == hf["requests"] == r["clients"]
        assert r["ratios"]["batched_over_serial"] == round(b["tokens_per_s"] / s["tokens_per_s"], 4)
        assert r["ratios"]["batched_over_hf"] == round(b["tokens_per_s"] / hf["tokens_per_s"], 4)
        assert hf["call_tokens_per_s"] < hf["tokens_per_s"]  # judged on the span, the whole call shown beside it
        assert b["output_tokens"] == s["output_tokens"] == hf["output_tokens"]  # the same work on each side
        assert s["steps"] >= b["steps"]  # one at a time never takes fewer steps for the same tokens
        # the scripted model answers the same whether batched, alone or through the stand-in
        assert r["greedy"]["batched_vs_serial"] == {
            "identical": r["clients"],
            "compared": r["clients"],
            "first_diff": [],
        }
        assert r["greedy"]["hf_vs_serial"]["identical"] == r["clients"]
    for n in (2, 3):
        values = [r["ratios"]["batched_over_serial"] for r in rows if r["clients"] == n]
        judged = report["ratios"][f"batched_over_serial_{n}"]
        assert judged["spread"]["n"] == 2 and judged["value"] == round(percentile(values, 50), 4)
        assert judged["target"] is None  # the targets are for 8 and 16 clients
        assert report["ratios"][f"batched_over_hf_{n}"]["target"] == 0.95
    lone = report["lone"]
    assert len(lone["comparisons"]) == 2 and all(c["greedy_identical"] for c in lone["comparisons"])
    assert report["ratios"]["lone_step_over_bare"]["target"] == 1.10


def test_class_scenario_reports_distributions_preemptions_prefix_hits_and_failures(batching_report):
    _, report, printed, _ = batching_report
    c = report["class"]
    assert c["clients"] == 16 and c["prefix_caching"] is True
    kinds = [r["kind"] for r in c["requests"]]
    assert sorted(set(kinds)) == sorted(k for k, _, _ in class_scenario.MIX) and all(kinds.count(k) == 4 for k in kinds)
    arrivals = [r["arrival_s"] for r in c["requests"]]
    assert arrivals == sorted(arrivals) and 0 <= arrivals[0] and arrivals[-1] <= 0.2
    for name, sc in c["scenarios"].items():
        for mode in ("batched", "serial"):
            run = sc[mode]
            assert (run["completed"], run["failures"]) == (16, 0)
            for metric in ("ttft_ms", "tpot_ms", "itl_ms"):
                assert {"p50", "p95", "p99"} <= run["metrics"][metric].keys()
                assert run["metrics"][metric]["n"] > 0
            # the engine's counters over the run agree with what the requests' own events said
            assert run["preemptions"] == sum(r["preemptions"] for r in run["per_request"])
            assert run["prefix_hit_tokens"] == run["request_prefix_hit_tokens"]
            assert run["preempted_requests"] <= 16 and run["prefix_hit_requests"] <= 16
            delays = [r["arrival_s"] for r in run["per_request"]]
            assert delays == (arrivals if name == "arrivals" else [0.0] * 16)
        b, s = sc["batched"]["metrics"]["ttft_ms"]["p99"], sc["serial"]["metrics"]["ttft_ms"]["p99"]
        assert sc["ratios"]["ttft_p99_over_serial"] == round(b / s, 4)
        assert sc["greedy"]["compared"] == 16
        assert report["ratios"][f"class_{name}_ttft_p99_over_serial"]["target"] == 0.15
    # one at a time with a cold prefix cache: every long prompt after the first reuses the shared document
    serial = c["scenarios"]["burst"]["serial"]
    assert serial["prefix_hit_requests"] >= 3 and serial["prefix_hit_tokens"] > 0
    assert "Class scenario: 16 clients" in printed and "class, burst: p99 TTFT batched / one at a time" in printed


def test_batching_refuses_what_it_cannot_do_in_one_line(capsys):
    for extra in (["--via-websocket", "ws://127.0.0.1:9/ws"], ["--quick"], ["--prompt-lens", "32,64"]):
        assert main(["bench", "--model", "fake", "--batching", "--no-progress", *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("kvscope: error: ") and err.count("\n") == 1


def test_transformers_generate_batch_runs_beside_an_engine_on_kvscopes_attention():
    from model_runner.loading import loader
    from model_runner.local.model.attention_inspect import IMPLEMENTATION, register

    model = loader.load("fake", "cpu", "auto").model.base  # the test model's real Llama
    model.set_attn_implementation(register())  # as the engine's transformers decoder leaves it
    run = baselines.hf_generate_batch(model, [[5, 6, 7], [8, 9]], 3, frozenset({0}), 16, 16, 64)
    assert [len(tokens) for tokens in run.token_ids] == [3, 3]
    assert model.config._attn_implementation == IMPLEMENTATION  # the engine's attention put back
