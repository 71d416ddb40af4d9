"""`kvscope bench` on the fake model: the statistics, the prompt fitting, the grid, failures counted
in the totals (one of each injected), the JSON checked against its schema, the printed report."""

from __future__ import annotations

import builtins
import contextlib
import copy
import io
import json
import math

import pytest

from bench import grid_report as bench_report
from bench import runner
from bench.clients import InProcessClient, Job, run_jobs
from bench.grid import FULL, QUICK, SCHEMA, Bench, Grid, cells_of
from bench.grid_report import ratio_report
from bench.measure import INSTRUCTION, Target, fit_prompt
from bench.report import describe, totals, validate
from formulas import cost
from kvscope.cli import main
from model_runner.loading import loader
from model_runner.loading.model_shape import shape_of
from model_runner.protocol.metrics import percentile
from model_runner.protocol.request import parse_generate

# ---- statistics ----------------------------------------------------------------------------------


def test_percentiles_interpolate_between_order_statistics():
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile(list(range(1, 11)), 90) == pytest.approx(9.1)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    d = describe([10, 20, 30, 40])
    assert (d["n"], d["mean"], d["p50"], d["min"], d["max"]) == (4, 25, 25, 10, 40)
    assert describe([]) == {
        "n": 0,
        "mean": None,
        "p50": None,
        "p90": None,
        "p95": None,
        "p99": None,
        "min": None,
        "max": None,
    }


def test_ratios_report_median_and_range_and_judge_targets():
    comparisons = [
        {"ratios": {"engine_step_over_bare": v, "engine_tps_over_generate": t}}
        for v, t in ((1.01, 1.0), (1.05, 1.2), (1.02, 1.1))
    ]
    cells = [{"delivery_ms": describe([1.0, 2.0, 50.0])}]
    slow = [1.0, 2.0, 50.0]  # p95 45.2 ms
    report = ratio_report(comparisons, cells, (slow, [x - 10 for x in slow]), "websocket")
    step = report["engine_step_over_bare"]
    assert step["spread"] == {"n": 3, "median": 1.02, "min": 1.01, "max": 1.05}
    assert (step["target"], step["met"]) == (1.03, True)
    assert report["engine_tps_over_generate"]["met"] is True  # median 1.1 >= 1.10
    assert report["bare_tps_over_generate"]["spread"]["n"] == 0 and report["bare_tps_over_generate"]["met"] is None
    assert report["delivery_p95_ms"]["met"] is False  # even the lower bound, 35.2 ms, is over 30 ms
    bounds = ratio_report(comparisons, cells, (slow, [x - 40 for x in slow]), "websocket")["delivery_p95_ms"]
    assert (bounds["value"], bounds["value_lower"], bounds["met"]) == (45.2, 5.2, None)  # between: undecided
    fast = ratio_report(comparisons, cells, ([1.0, 2.0, 3.0], [0.5, 1.0, 2.0]), "websocket")["delivery_p95_ms"]
    assert fast["met"] is True
    in_process = ratio_report(comparisons, cells, (slow, slow), "in-process")
    assert in_process["delivery_p95_ms"]["target"] is None  # the browser target is judged over the socket only


# ---- the grid and prompts ------------------------------------------------------------------------


def test_quick_repeats_and_baselines_only_the_ratio_cell():
    cells = cells_of(QUICK, quick=True, baselines=True)
    main_cells = [c for c in cells if c.baselines]
    assert main_cells and all(c.prompt == QUICK.prompt_lens[0] and c.clients == 1 for c in main_cells)
    assert all(c.repeats == QUICK.repeats for c in main_cells)
    assert all(c.repeats == 1 for c in cells if not c.baselines)
    full = cells_of(FULL, quick=False, baselines=True)
    assert len(full) == len(FULL.prompt_lens) * len(FULL.output_lens) * len(FULL.concurrency)
    assert {c.clients for c in full if c.baselines} == {1} and all(c.repeats == FULL.repeats for c in full)
    assert not any(c.baselines for c in cells_of(FULL, quick=False, baselines=False))


@pytest.mark.parametrize("target", [80, 150, 300])
def test_prompt_fits_its_token_target_deterministically(fake_engine, target):
    prompt = fit_prompt(fake_engine.describe_prompt, target)
    # Byte tokenizer: one more word adds at most its length plus a space.
    assert target - 16 <= prompt.tokens <= target
    assert prompt == fit_prompt(fake_engine.describe_prompt, target)
    counted = fake_engine.describe_prompt(parse_generate({"messages": prompt.messages}))["counts"]["total"]
    assert counted == prompt.tokens


def test_prompt_below_the_template_is_the_shortest_one(fake_engine):
    prompt = fit_prompt(fake_engine.describe_prompt, 5)
    assert prompt.messages[0]["content"] == INSTRUCTION.split()[0] and prompt.tokens > 5


# ---- failures, timeouts and cancellations are counted, never dropped -----------------------------


@pytest.fixture
def slow_engine(engine_factory, monkeypatch):
    """20 ms per model step; a prompt containing 'boom' makes the model's forward raise."""
    engine = engine_factory("fake:delay=20")
    decoder = engine._forward.decoder  # the model's step, whichever decoder runs it
    run = decoder.run

    def failing_run(step):
        if b"boom" in bytes(i for i in step.ids.tolist() if i < 256):
            raise RuntimeError("injected failure")
        return run(step)

    monkeypatch.setattr(decoder, "run", failing_run)
    return engine


def ask(content="Tell me about caches.", **fields) -> dict:
    return {"messages": [{"role": "user", "content": content}], **fields}


def test_one_of_each_failure_is_counted_in_the_totals(slow_engine):
    jobs = [
        Job(ask(max_new_tokens=200)),  # completes (eos)
        Job(ask(max_new_tokens=200, timeout_s=0.05)),  # times out
        Job(ask(max_new_tokens=200), cancel_after_tokens=3),  # cancelled by the client
        Job(ask("boom, the model breaks", max_new_tokens=200)),  # the model step fails
        Job(ask(max_new_tokens=1000)),  # refused at submit: 1000 > the fake's 512-token window
    ]
    records, wall = run_jobs(InProcessClient(slow_engine), jobs, "inj")
    assert [r.outcome for r in records] == ["completed", "timeout", "cancelled", "error", "error"]
    t = totals(records)
    assert (t["requests"], t["completed"], t["timeouts"], t["cancelled"], t["errors"]) == (5, 1, 1, 1, 2)
    assert t["reasons"] == {
        "completed:eos": 1,
        "timeout:timeout": 1,
        "cancelled:client": 1,
        "error:internal": 1,
        "error:context_overflow": 1,
    }
    assert wall > 0

    cell = _cell(slow_engine, records, wall)
    assert cell["totals"] == t
    assert cell["metrics"]["ttft_ms"]["n"] == 1  # latency distributions hold completed requests only
    assert len(cell["requests"]) == 5 and validate(cell, SCHEMA["properties"]["cells"]["items"]) == []


def _cell(engine, records, wall) -> dict:
    from kvscope.cli import build_parser

    args = build_parser().parse_args(["bench", "--model", "fake"])
    target = Target("in-process", InProcessClient(engine), engine.loaded, engine.describe_prompt, lambda: None)
    b = Bench(args, target, Grid((40,), (8,), (5,), 1))
    try:
        return b.cell(fit_prompt(engine.describe_prompt, 40), 200, 5, 1, records, [wall])
    finally:
        b.close()


# ---- the whole command on the fake model ---------------------------------------------------------


@pytest.fixture(scope="module")
def fake_report(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "run.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(
            [
                "bench",
                "--model",
                "fake",
                "--prompt-lens",
                "60,120",
                "--output-lens",
                "8",
                "--concurrency",
                "1,2",
                "--repeats",
                "2",
                "--json",
                str(path),
                "--no-progress",
            ]
        )
    return code, json.loads(path.read_text()), printed.getvalue()


def test_bench_command_writes_json_that_passes_its_schema(fake_report):
    code, report, _ = fake_report
    assert code == 0
    assert validate(report, SCHEMA) == []
    assert report["mode"] == "in-process" and report["settings"]["repeats"] == 2
    assert [(c["prompt_tokens_target"], c["concurrency"]) for c in report["cells"]] == [
        (60, 1),
        (60, 2),
        (120, 1),
        (120, 2),
    ]
    per_cells = sum(c["totals"]["requests"] for c in report["cells"])
    assert per_cells == 2 * (1 + 2) * 2  # two prompts x (1 + 2 clients) x 2 repeats
    assert report["totals"]["requests"] == per_cells + 2  # plus the kv_cache on/off probe
    assert report["totals"]["completed"] == report["totals"]["requests"]


def test_baselines_interleave_and_greedy_output_matches_the_bare_loop(fake_report):
    _, report, _ = fake_report
    comparisons = report["comparisons"]
    assert len(comparisons) == 4  # the one-client cells, every repeat
    assert {tuple(c["order"]) for c in comparisons} == {
        ("engine", "bare_loop", "generate_streamer"),
        ("bare_loop", "generate_streamer", "engine"),
    }
    assert all(c["greedy_identical"] is True for c in comparisons)
    assert all(c["ratios"]["engine_step_over_bare"] > 0 for c in comparisons)
    # the engine's gaps between tokens always hold its model step, so what is outside is >= 0
    assert all(c["engine"]["outside_model_ms_median"] >= 0 for c in comparisons)
    assert all(c["generate_streamer"] is None for c in comparisons)  # the fake model has no generate()
    assert report["kv_cache_off"]["greedy_identical"] is True
    assert any("generate+streamer baseline skipped" in n for n in report["notes"])


@pytest.fixture(scope="module")
def int8_report(tmp_path_factory):
    """A small bench on the fake model's int8 route, where the head is an int8 copy and the embedding is not read."""
    path = tmp_path_factory.mktemp("bench") / "int8.json"
    args = ["bench", "--model", "fake", "--dtype", "int8", "--prompt-lens", "60", "--output-lens", "6"]
    args += ["--concurrency", "1", "--repeats", "1", "--no-cache-probe", "--json", str(path), "--no-progress"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(args) == 0
    return json.loads(path.read_text())


def test_the_estimates_are_the_cost_models_counts_over_the_measured_times(int8_report):
    shape = shape_of(loader.load("fake", "cpu", "int8"))
    compared = [c for c in int8_report["comparisons"] if c["estimates"]]
    assert compared
    for c in compared:
        e, engine, tokens = c["estimates"], c["engine"], c["prompt_tokens"]
        read = cost.decode_step_bytes(shape, 1, tokens + engine["tokens"] / 2)  # weights as int8 holds them
        assert e["decode_gb_per_s"] == round(read / (engine["step_ms_median"] / 1000) / 1e9, 3)
        flops = cost.prefill_flops(shape, tokens)
        assert e["prefill_gflop_per_s"] == round(flops / (engine["prefill_ms"] / 1000) / 1e9, 3)
    # the compute ceiling is the int8 kernel the layers run, not a float32 matmul
    assert "int8 weight kernel" in int8_report["ceilings"]["matmul"]["what"]


def test_schema_check_names_what_is_broken(fake_report):
    _, report, _ = fake_report
    broken = copy.deepcopy(report)
    del broken["totals"]["errors"]
    broken["cells"][1]["metrics"]["itl_ms"]["p99"] = "slow"
    broken["ratios"]["engine_step_over_bare"]["met"] = "yes"
    broken["mode"] = "carrier pigeon"
    problems = validate(broken, SCHEMA)
    assert "$.totals: missing 'errors'" in problems
    assert any(p.startswith("$.cells[1].metrics.itl_ms.p99: expected number or null") for p in problems)
    assert any(p.startswith("$.ratios.engine_step_over_bare.met") for p in problems)
    assert any(p.startswith("$.mode:") for p in problems)


def test_printed_report_has_definitions_distributions_ratios_and_totals(fake_report):
    _, report, printed = fake_report
    assert "time to first token: request sent -> first token event received" in printed
    for label in ("queue", "TTFT", "TPOT", "ITL", "E2E"):
        assert f"\n  {label:8}" in printed
    assert "p50" in printed and "p90" in printed and "p99" in printed
    assert "engine decode step / bare loop step" in printed and "<= 1.03" in printed
    assert "GB/s" in printed and "GFLOP/s" in printed
    t = report["totals"]
    assert f"Totals: {t['requests']} requests: {t['completed']} completed, 0 timeouts, 0 cancelled, 0 errors" in printed


def test_plot_without_matplotlib_says_how_to_get_it(fake_report, monkeypatch, tmp_path):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    message = bench_report.plot(fake_report[1], str(tmp_path / "out.png"))
    assert message == bench_report.PLOT_MISSING and "pip install" in message
    assert not (tmp_path / "out.png").exists()


def bench_imports() -> dict[str, set[str]]:
    """Each bench module's bench modules it imports, late imports too (`from .x import` and `from bench.x import`)."""
    import ast
    from pathlib import Path

    root = Path(runner.__file__).parent
    graph = {}
    for path in root.glob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level == 1 or (node.module or "").startswith("bench.")):
                module = (node.module or "").removeprefix("bench.")
                names |= {module} if module else {alias.name for alias in node.names}
        graph[path.stem] = names & {p.stem for p in root.glob("*.py")}
    return graph


def test_bench_modules_import_each_other_in_one_direction_only():
    """No import cycle among bench modules (runner once imported batching and dtypes, which imported it back)."""
    graph = bench_imports()

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph[start])

    cycles = sorted(m for m in graph if reaches(m, m, {m}))
    assert not cycles, cycles
    assert {"batching", "dtypes"} <= graph["runner"]  # the command dispatches to them (so the graph is read)


def test_bad_grid_arguments_are_refused_in_one_line(capsys):
    assert (
        main(
            [
                "bench",
                "--model",
                "fake",
                "--prompt-lens",
                "400",
                "--output-lens",
                "200",
                "--no-progress",
                "--json",
                "/dev/null",
            ]
        )
        == 2
    )
    assert "exceeds" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--prompt-lens", "ten"])


def test_the_cache_off_probe_says_where_the_answers_part_and_how_close_the_choice_was():
    """Without the cache each step is a whole-sequence forward (other sums), so a parting is reported with the
    cached run's top-two gap there, read from the token events' candidates, for a reader to tell rounding
    (a near-tie) from a bug."""
    from types import SimpleNamespace

    from bench.clients import RequestRecord
    from bench.grid import cache_off_agreement

    def record(ids, probs):
        r = RequestRecord("r")
        for index, (token, (p1, p2)) in enumerate(zip(ids, probs)):
            candidates = [{"prob": p1}, {"prob": p2}]
            r.observe(SimpleNamespace(type="token", t_ms=index, id=token, step_ms=1.0, candidates=candidates), 0.0)
        r.observe(SimpleNamespace(type="finished", t_ms=9, reason="length", metrics=None), 0.0)
        return r

    cached = record([5, 6, 7], [(0.9, 0.05), (0.5, 0.49), (0.6, 0.3)])
    same = cache_off_agreement(cached, record([5, 6, 7], [(0.9, 0.05)] * 3))
    assert same == {"greedy_identical": True, "first_difference": None, "top_two_gap_there": None}
    parted = cache_off_agreement(cached, record([5, 8, 7], [(0.9, 0.05)] * 3))
    assert parted["greedy_identical"] is False and parted["first_difference"] == 1
    assert parted["top_two_gap_there"] == pytest.approx(math.log(0.5 / 0.49), abs=1e-4)
    printed = io.StringIO()
    bench_report._cache_off({"prompt_tokens": 9, **_cache_off_runs(), **parted}, printed)
    assert "parted at token 1, where the top two were 0.0202 logits apart" in printed.getvalue()


def _cache_off_runs() -> dict:
    run = {"outcome": "completed", "step_ms": [1.0], "first_step_ms": 1.0, "last_step_ms": 1.0, "growth": None}
    return {"with_cache": run, "without_cache": run}
