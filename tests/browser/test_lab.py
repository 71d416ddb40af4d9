"""The live lab in Chromium: composer and budget against the fake model; runs, Stop, experiments and
trace export against the real default model. Every WebSocket frame the page receives is recorded
(an init script wraps WebSocket), so tests check what the server sent as well as what the lab drew."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from kvscope_testkit import screenshot
from playwright.sync_api import expect

LAB = "#lab"
RUN_TIMEOUT = 120_000  # ms: one real-model run on a shared 2-core CPU
EXPERIMENT_TIMEOUT = 300_000

# Records, in the page, every socket opened and every frame sent and received, in order.
RECORD_FRAMES = """
(() => {
  const Native = window.WebSocket;
  window.__labSockets = [];
  window.__labFrames = [];
  window.__labSent = [];
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      window.__labSockets.push(this);
      this.addEventListener('message', (m) => {
        let frame;
        try { frame = JSON.parse(m.data); } catch { return; }
        window.__labFrames.push(frame);
        // Asked for: drop this socket at its first token, before the page's own listener sees that frame (a
        // closing socket dispatches no more frames, so the answer cannot finish first, however late the test is).
        if (window.__labDropAtFirstToken && frame.type === 'token') {
          window.__labDropAtFirstToken = false;
          this.close(4000, 'test drop');
        }
      });
    }
    send(data) {
      window.__labSent.push(JSON.parse(data));
      super.send(data);
    }
  };
})();
"""


@pytest.fixture
def ignored_console_errors():
    """Besides the favicon probe, the HTTP 400s the budget test provokes on purpose (Chromium logs
    every 4xx fetch as a console error)."""
    return ("/favicon.ico", "status of 400")


def open_lab(page, server):
    page.add_init_script(RECORD_FRAMES)
    page.goto(f"{server.url}/")
    # Generous: the page's other figures load too, on a CPU shared with the model.
    expect(page.locator('#model-status[data-status="ready"]')).to_be_attached(timeout=120_000)
    expect(page.locator("#lab-prompt-tokens .ptok").first).to_be_attached(timeout=60_000)
    page.locator(LAB).scroll_into_view_if_needed()


def frames(page, type_=None):
    all_frames = page.evaluate("window.__labFrames")
    return [f for f in all_frames if type_ is None or f.get("type") == type_]


def run_and_wait(page, status="finished", timeout=RUN_TIMEOUT):
    page.click("#lab-run")
    expect(page.locator(f'#lab-status[data-status="{status}"]')).to_be_attached(timeout=timeout)


def prompt_total(page) -> int:
    """The prompt token count the page shows once it has counted the current composer state."""
    text = page.locator("#lab-counts").inner_text()
    return int(re.match(r"(\d+) prompt tokens", text).group(1))


def set_max_new(page, value: int):
    page.fill("#lab-max-new", str(value))


def wait_budget(page, state: str, contains: str = ""):
    budget = page.locator(f'#lab-budget[data-state="{state}"]')
    expect(budget).to_be_attached(timeout=10_000)
    if contains:
        expect(page.locator("#lab-budget-decision")).to_contain_text(contains)


def shoot(page, name: str, selector: str):
    """Screenshots at phone and desktop widths, with `selector` scrolled into view."""
    for width, height in ((375, 800), (1440, 900)):
        page.set_viewport_size({"width": width, "height": height})
        # Charts redraw for the new width on the next animation frame; wait two to be sure.
        page.evaluate("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(r)))")
        page.locator(selector).scroll_into_view_if_needed()
        screenshot(page, f"{name}-{width}")


def import_module(page, path: str, expr: str):
    """Evaluates `expr` with the module at `path` bound to `m`."""
    return page.evaluate(f"async () => {{ const m = await import('{path}'); return {expr}; }}")


# ---- pure modules (fake server only serves the files) ----------------------------------------

COST = json.loads((Path(__file__).resolve().parents[2] / "static/data/cost_golden.json").read_text(encoding="utf-8"))
PREFILL_CASES = [c for c in COST["cases"] if c["figure"] == "prefill_flops"]
TINY = COST["shapes"]["tiny-float32"]


def golden(figure: str, shape: str, args: list) -> int:
    return next(
        c["value"] for c in COST["cases"] if c["figure"] == figure and c["shape"] == shape and c["args"] == args
    )


def test_prefill_flops_match_the_shared_golden_cases(fake_server, page):
    """The lab's prefill FLOP/s is the cost model's count (static/data/cost_golden.json, which cost.py and
    cost.js both reproduce) over the measured time; without the model's shape (a remote engine) it is null."""
    page.goto(fake_server.url + "/")
    cases = [{"facts": {"cost_shape": COST["shapes"][c["shape"]]}, "tokens": c["args"][0]} for c in PREFILL_CASES]
    got = import_module(
        page, "/static/js/lab/metrics.js", f"{json.dumps(cases)}.map((c) => m.prefillFlopsPerS(c.facts, c.tokens, 500))"
    )
    assert got == [c["value"] * 2 for c in PREFILL_CASES]
    assert import_module(page, "/static/js/lab/metrics.js", "m.prefillFlopsPerS({}, 3, 500)") is None


def test_sweep_conclusion_follows_the_measured_numbers(fake_server, page):
    """The sweep's summary is worded from its rows: not always "compute-bound" / "memory-bound"."""
    page.goto(fake_server.url + "/")

    def summary(rows):
        rows_js = json.dumps(rows)
        return import_module(
            page,
            "/static/js/lab/experiments-view.js",
            f"(async () => {{ const e = await import('/static/js/lab/experiments.js'); const rows = {rows_js};"
            " return m.sweepSummary(rows[rows.length - 1], e.sweepVerdict(rows)); })()",
        )

    def row(tokens, prefill_gflops, decode_gflops):
        return {
            "promptTokens": tokens,
            "prefillFlopsPerS": prefill_gflops * 1e9,
            "decodeFlopsPerS": decode_gflops * 1e9,
            "decodeBytesPerS": 1e9,
        }

    climbing = summary([row(30, 5, 1), row(120, 15, 1), row(500, 30, 1)])
    assert "not yet compute-bound" in climbing
    # a lower FLOP rate than prefill's proves nothing about memory: the summary says so instead of a verdict
    assert (
        "memory-bound only when it moves its bytes near" in climbing and "set its pace (memory-bound)" not in climbing
    )
    level = summary([row(30, 29, 1), row(120, 30, 1), row(500, 31, 1)])
    assert "levelled off" in level and "not yet" not in level and "rose" not in level
    rose = summary([row(30, 5, 1), row(120, 29, 1), row(500, 30, 1)])
    assert "rose ×6.0 from 30 to 500 tokens and then levelled off" in rose and "not yet" not in rose
    unclear = summary([row(30, 5, 4), row(500, 5, 4)])
    assert "memory-bound" not in unclear and "does not show decode held back" in unclear


def test_metric_math(fake_server, page):
    page.goto(fake_server.url + "/")
    mod = "/static/js/lab/metrics.js"
    # numpy.percentile([10, 20, 30, 40], [50, 90, 99]) = 25, 37, 39.7
    assert import_module(page, mod, "[50, 90, 99].map((p) => m.percentile([40, 10, 30, 20], p))") == pytest.approx(
        [25, 37, 39.7]
    )
    assert import_module(page, mod, "m.percentile([], 50)") is None
    assert import_module(page, mod, "m.interTokenLatencies([100, 140, 190])") == [40, 50]
    assert import_module(page, mod, "m.timePerOutputToken(1000, 200, 5)") == 200
    assert import_module(page, mod, "m.timePerOutputToken(1000, 200, 1)") is None
    # The golden tiny shape (static/data/cost_golden.json): its prefill of 3 tokens in 0.5 s, and one decode
    # step at 100 cached positions in 0.1 s.
    facts = json.dumps({"cost_shape": TINY})
    prefill = golden("prefill_flops", "tiny-float32", [3])
    assert import_module(page, mod, f"m.prefillFlopsPerS({facts}, 3, 500)") == prefill * 2
    step_bytes = golden("decode_step_bytes", "tiny-float32", [1, 100])
    assert import_module(page, mod, f"m.decodeBytesPerS({facts}, 100, 100)") == step_bytes * 10
    # Theil–Sen: the median pairwise slope ignores the one disturbed point.
    assert (
        import_module(
            page, mod, "m.robustSlope([{x: 0, y: 1}, {x: 1, y: 3}, {x: 2, y: 5}, {x: 3, y: 7}, {x: 4, y: -50}])"
        )
        == 2
    )
    events = [
        {"type": "accepted", "t_ms": 1, "prompt_tokens": 10, "content_tokens": 4, "template_tokens": 6},
        {"type": "prefill_start", "t_ms": 5, "prompt_tokens": 10},
        {
            "type": "prefill_end",
            "t_ms": 50,
            "ms": 45,
            "cache_tokens": 10,
            "cache_bytes_measured": 100,
            "cache_bytes_formula": 100,
        },
        {
            "type": "token",
            "t_ms": 50,
            "index": 0,
            "text": "A",
            "step_ms": 0,
            "cache_tokens": 10,
            "cache_bytes_measured": 100,
            "cache_bytes_formula": 100,
        },
        {
            "type": "token",
            "t_ms": 70,
            "index": 1,
            "text": "",
            "step_ms": 18,
            "cache_tokens": 11,
            "cache_bytes_measured": 110,
            "cache_bytes_formula": 110,
        },
        {
            "type": "token",
            "t_ms": 100,
            "index": 2,
            "text": "b",
            "step_ms": 28,
            "cache_tokens": 12,
            "cache_bytes_measured": 120,
            "cache_bytes_formula": 120,
        },
        {"type": "finished", "t_ms": 110, "tokens": 3, "text": "Ab", "reason": "eos", "metrics": {}},
    ]
    m = import_module(page, mod, f"m.summarize({json.dumps(events)})")
    assert (m["queueMs"], m["ttftMs"], m["e2eMs"], m["tokens"]) == (5, 50, 110, 3)
    # Decode tokens/s is (n − 1) ÷ (t_last − t_first) (shared/cost.js): 2 gaps over 50 ms, not 1000 ÷ TPOT,
    # which also counts the time after the last token.
    assert m["tpotMs"] == 30 and m["itlMs"] == [20, 30] and m["decodeTokensPerS"] == pytest.approx(2 / 0.050)
    assert (m["cacheBytesMeasured"], m["cacheBytesFormula"], m["firstTextMs"]) == (120, 120, 50)


def test_chart_scale_math(fake_server, page):
    page.goto(fake_server.url + "/")
    mod = "/static/js/charts/scale.js"
    assert import_module(page, mod, "m.ticks([0, 1], 5)") == [0, 0.2, 0.4, 0.6, 0.8, 1]
    assert import_module(page, mod, "m.niceDomain([3, 97], 5)") == [0, 100]
    assert import_module(page, mod, "[0, 1200, 3.5e9, 0.25].map(m.formatTick)") == ["0", "1.2k", "3.5G", "0.25"]
    bins = import_module(page, mod, "m.histogramBins([1, 2, 2, 3, 10], 3)")
    assert [b["count"] for b in bins] == [4, 0, 1]


# ---- composer and budget (fake model: byte tokenizer, 512-token window) -------------------------


def test_composer_colours_tokens_by_provenance(fake_server, page, console_errors):
    open_lab(page, fake_server)
    page.click('[data-add-turn="user"]')
    page.locator("#lab-turns li textarea").nth(0).fill("Earlier question")
    page.click('[data-add-turn="assistant"]')
    page.locator("#lab-turns li textarea").nth(1).fill("Earlier answer")
    page.check("#lab-retrieved-on")
    expect(page.locator("#lab-retrieved")).to_be_visible()
    for source in ("marker", "system", "user", "assistant", "retrieved"):
        expect(page.locator(f"#lab-prompt-tokens .ptok.src-{source}").first).to_be_attached()
    # The fake model's tokenizer is one token per byte: the assistant turn is 14 tokens.
    expect(page.locator("#lab-prompt-tokens .ptok.src-assistant")).to_have_count(len("Earlier answer"))
    counts = page.locator("#lab-counts").inner_text()
    total, content, template = map(int, re.findall(r"\d+", counts)[:3])
    assert total == content + template and template > 0
    assert page.locator("#lab-prompt-tokens .ptok").count() == total
    shoot(page, "lab-composer", ".lab-prompt")
    # Removing the assistant turn takes its tokens out of the prompt.
    page.get_by_role("button", name=re.compile("Remove turn 2")).click()
    expect(page.locator("#lab-prompt-tokens .ptok.src-assistant")).to_have_count(0)
    assert console_errors == []


def test_budget_boundary_exactly_full_accepted_one_over_rejected(fake_server, page, console_errors):
    open_lab(page, fake_server)
    prompt = prompt_total(page)
    window = 512  # the fake model's context window
    set_max_new(page, window - prompt)
    wait_budget(page, "full", f"{prompt} prompt + {window - prompt} new = {window} of {window} tokens (exactly full)")
    run_and_wait(page, "finished")
    accepted = frames(page, "accepted")[-1]
    assert accepted["budget"]["total"] == window and accepted["budget"]["action"] == "none"

    set_max_new(page, window - prompt + 1)
    wait_budget(page, "rejected", f"1 over the {window}-token window")
    assert page.locator("#lab-budget-over").bounding_box()["width"] > 0  # the bar shows the overflow
    run_and_wait(page, "error")
    expect(page.locator("#lab-status")).to_contain_text("context_overflow")
    assert frames(page)[-1]["code"] == "context_overflow"

    # The other policies fit the same request and say how.
    page.select_option("#lab-overflow", "shrink_output")
    wait_budget(page, "adjusted", f"lowered from {window - prompt + 1} to {window - prompt}")
    shoot(page, "lab-budget", "#lab-budget")
    assert console_errors == []


def test_truncate_history_policy_drops_oldest_turn(fake_server, page, console_errors):
    open_lab(page, fake_server)
    page.click('[data-add-turn="user"]')
    page.locator("#lab-turns li textarea").nth(0).fill("x" * 300)
    page.select_option("#lab-overflow", "truncate_history")
    set_max_new(page, 300)
    wait_budget(page, "adjusted", "dropping the oldest earlier message")
    assert console_errors == []


def test_run_streams_with_metrics_and_candidates_fake(fake_server, page, console_errors):
    open_lab(page, fake_server)
    set_max_new(page, 200)
    run_and_wait(page, "finished")
    done = frames(page, "finished")[-1]
    tokens = frames(page, "token")
    expect(page.locator("#lab-answer .atok")).to_have_count(len(tokens))
    assert page.locator("#lab-answer").get_attribute("data-complete") == "true"
    assert page.locator("#lab-answer").inner_text().strip() == done["text"].strip()
    for name in ("queue", "ttft", "tpot", "itl", "e2e", "tps", "cache"):
        assert page.locator(f'#lab-metrics [data-metric="{name}"] dd').first.inner_text() != "–", name
    # Hover a token: its five candidates, the chosen one marked.
    page.locator("#lab-answer .atok").nth(3).hover()
    rows = page.locator("#lab-candidates tr")
    expect(rows).to_have_count(5)
    expect(page.locator("#lab-candidates tr.is-chosen")).to_have_count(1)
    # The keyboard reaches every token too.
    page.focus("#lab-answer")
    page.keyboard.press("End")
    expect(page.locator("#lab-candidates p")).to_contain_text(f"Token {len(tokens) - 1}:")
    assert console_errors == []


def test_controls_reach_the_server(fake_server, page, console_errors):
    open_lab(page, fake_server)
    set_max_new(page, 200)
    page.fill("#lab-stop", "cache")
    page.check('input[name="lab-delivery"][value="buffered"]')
    page.fill("#lab-prefill-chunk", "16")
    run_and_wait(page, "finished")
    accepted = frames(page, "accepted")[-1]
    assert (accepted["delivery"], accepted["kv_cache"], accepted["prefill_chunk"]) == ("buffered", True, 16)
    assert len(frames(page, "prefill_chunk")) == -(-accepted["prompt_tokens"] // 16)
    page.uncheck("#lab-kv-cache")  # without a cache there are no chunks: the whole prefix every step
    page.fill("#lab-prefill-chunk", "0")
    run_and_wait(page, "finished")
    accepted = frames(page, "accepted")[-1]
    assert (accepted["kv_cache"], accepted["prefill_chunk"]) == (False, 0)
    done = frames(page, "finished")[-1]
    assert done["reason"] == "stop_string" and done["text"] == "Hello from the fake model. The "
    # Buffered: no token released text, and the answer shows the whole text once, at the end.
    assert all(t["text"] == "" for t in frames(page, "token"))
    expect(page.locator("#lab-answer .lab-answer-text")).to_have_text(done["text"])
    expect(page.locator("#lab-status")).to_contain_text("a stop string appeared")
    sent = page.evaluate("window.__labSent")[-1]
    assert sent["stop"] == ["cache"] and sent["sampling"] == {
        "temperature": 0,
        "top_k": None,
        "top_p": 1.0,
        "seed": None,
    }
    # Sampling sends its settings; the seed fixes the text.
    page.check('input[name="lab-sampling"][value="sample"]')
    page.fill("#lab-top-k", "40")
    page.fill("#lab-seed", "7")
    texts = []
    for _ in range(2):
        run_and_wait(page, "finished")
        texts.append(frames(page, "finished")[-1]["text"])
    assert page.evaluate("window.__labSent")[-1]["sampling"] == {
        "temperature": 0.7,
        "top_k": 40,
        "top_p": 0.9,
        "seed": 7,
    }
    assert texts[0] == texts[1]
    assert console_errors == []


def test_choose_one_of_masks_the_answer_and_the_token_panel_says_what_the_grammar_allowed(
    fake_server, page, console_errors
):
    open_lab(page, fake_server)
    expect(page.locator("#lab-choices")).to_be_disabled()  # only "choose one of" reads the choices
    page.select_option("#lab-constraint", "choice")
    page.fill("#lab-choices", "red\ngreen\n\n")
    run_and_wait(page, "finished")
    assert page.evaluate("window.__labSent")[-1]["constraint"] == {"kind": "choice", "spec": ["red", "green"]}
    done, first = frames(page, "finished")[-1], frames(page, "token")[0]
    assert done["text"] in ("red", "green") and first["mask"] == {"allowed": 2, "first_allowed": False}
    page.focus("#lab-answer")
    page.keyboard.press("Home")  # the first token: r or g allowed; the fake model wanted "H"
    note = page.locator("#lab-candidates .lab-mask-note")
    expect(note).to_contain_text("The grammar allowed 2 tokens at this step")
    expect(note).to_contain_text("first choice was forbidden")
    # Force JSON: the frame asks for an object; without a constraint no note is drawn.
    page.select_option("#lab-constraint", "json_object")
    set_max_new(page, 4)
    run_and_wait(page, "finished")
    assert page.evaluate("window.__labSent")[-1]["constraint"] == {"kind": "json_object"}
    assert frames(page, "finished")[-1]["text"].startswith('{"')
    page.select_option("#lab-constraint", "none")
    run_and_wait(page, "finished")
    assert "constraint" not in page.evaluate("window.__labSent")[-1]
    page.keyboard.press("Home")
    expect(page.locator("#lab-candidates .lab-mask-note")).to_have_count(0)
    assert console_errors == []


def test_dropped_connection_is_shown_and_not_retried(fake_server, page, console_errors):
    open_lab(page, fake_server)
    set_max_new(page, 200)
    page.evaluate("() => { window.__labDropAtFirstToken = true; }")  # the browser drops the socket mid-answer
    page.click("#lab-run")
    expect(page.locator("#lab-answer .atok").first).to_be_attached(timeout=RUN_TIMEOUT)
    expect(page.locator('#lab-status[data-status="connection_lost"]')).to_be_attached(timeout=RUN_TIMEOUT)
    expect(page.locator("#lab-status")).to_contain_text("did not finish")
    expect(page.locator("#lab-answer .lab-answer-end")).to_contain_text("did not finish")
    assert page.locator("#lab-answer").get_attribute("data-complete") == "false"
    assert page.evaluate("window.__labSockets.length") == 1  # nothing retried
    assert console_errors == []


def test_export_import_and_replay_trace(fake_server, page, console_errors, tmp_path):
    open_lab(page, fake_server)
    set_max_new(page, 20)
    run_and_wait(page, "finished")
    row = page.locator("#lab-history-table tbody tr").first
    with page.expect_download() as download:
        row.get_by_role("button", name=re.compile("Export run")).click()
    path = tmp_path / "trace.json"
    download.value.save_as(path)
    trace = json.loads(path.read_text())
    assert (trace["format"], trace["version"]) == ("kvscope-trace", 1) and trace["recorded_at"]
    assert trace["events"] == frames(page)  # exactly what the server sent, ending with `finished`
    assert trace["events"][-1]["type"] == "finished"
    assert trace["model"]["context_window"] == 512
    assert trace["prompt"]["tokens"] and trace["request"]["messages"][-1]["role"] == "user"
    # The walkthrough's own validator accepts it.
    assert page.evaluate("async (t) => (await import('/static/js/trace.js')).validateTrace(t)", trace) == []

    # Replay hands the same trace to the walkthrough and brings the walkthrough into view.
    page.evaluate("() => document.addEventListener('kvscope:replay-trace', (e) => { window.__replayed = e.detail; })")
    row.get_by_role("button", name=re.compile("Replay run")).click()
    replayed = page.wait_for_function("window.__replayed").json_value()
    assert replayed["events"] == trace["events"]
    expect(page.locator("#walkthrough")).to_be_in_viewport()
    # ... and the walkthrough takes it (its own wording, so matched loosely).
    expect(page.locator("#walkthrough")).to_contain_text(re.compile("run from the lab", re.I))

    # Import makes it a run of its own, with the same server-clock metrics.
    page.set_input_files("#lab-import-file", str(path))
    expect(page.locator("#lab-import-status")).to_contain_text("Imported")
    rows = page.locator("#lab-history-table tbody tr")
    expect(rows).to_have_count(2)

    def cells(r):
        return r.locator("td").all_inner_texts()[2:11]  # outcome … tok/s

    assert cells(rows.nth(0)) == cells(rows.nth(1))
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something-else"}')
    page.set_input_files("#lab-import-file", str(bad))
    expect(page.locator("#lab-import-status")).to_contain_text("Could not import")
    expect(rows).to_have_count(2)
    assert console_errors == []


def test_invalid_field_is_named(fake_server, page, console_errors):
    open_lab(page, fake_server)
    page.check('input[name="lab-sampling"][value="sample"]')
    page.fill("#lab-temperature", "5")
    expect(page.locator("#lab-counts")).to_contain_text("sampling.temperature")
    run_and_wait(page, "error")
    expect(page.locator("#lab-status")).to_contain_text("sampling.temperature")
    assert console_errors == []


# ---- the real default model -------------------------------------------------------------------


def test_real_run_streams_and_shows_all_metrics(real_server, page, console_errors):
    open_lab(page, real_server)
    set_max_new(page, 24)
    run_and_wait(page, "finished")
    tokens = frames(page, "token")
    done = frames(page, "finished")[-1]
    assert len(tokens) == done["tokens"] >= 2
    assert any(t["text"] for t in tokens[:-1])  # text streamed before the finish
    # The default question is one the small model answers on topic, greedy, without repeating itself
    # (its answer to the old default, "What is a KV cache?", was an invented protocol).
    sentences = [x.strip() for x in done["text"].replace("\n", " ").split(".") if x.strip()]
    assert "stud" in done["text"].lower() and len(sentences) == len(set(sentences)), done["text"]
    expect(page.locator("#lab-answer .atok")).to_have_count(len(tokens))
    for name in ("queue", "ttft", "tpot", "itl", "e2e", "tps", "cache"):
        assert page.locator(f'#lab-metrics [data-metric="{name}"] dd').first.inner_text() != "–", name
    ttft = float(page.locator('#lab-metrics [data-metric="ttft"] dd').first.inner_text().split()[0])
    assert ttft == pytest.approx(done["metrics"]["ttft_ms"], abs=0.1)  # same definition as the server
    last = tokens[-1]
    assert (
        f"{last['cache_bytes_measured']:,} B measured vs {last['cache_bytes_formula']:,} B formula"
        in page.locator('#lab-metrics [data-metric="cache"] dd').first.inner_text()
    )
    # One latency point per decode step, one cache point per token.
    assert page.locator('#lab-latency-chart [data-series="step time"] circle').count() == len(tokens) - 1
    assert page.locator('#lab-cache-chart [data-series="measured"] circle').count() == len(tokens)
    page.locator("#lab-answer .atok").nth(1).hover()
    expect(page.locator("#lab-candidates tr")).to_have_count(5)
    shoot(page, "lab-run", "#lab-run-view")
    assert console_errors == []


def test_real_stop_mid_answer_is_cancelled_at_the_server(real_server, page, console_errors):
    open_lab(page, real_server)
    set_max_new(page, 400)
    page.click("#lab-run")
    expect(page.locator("#lab-answer .atok").nth(2)).to_be_attached(timeout=RUN_TIMEOUT)
    page.click("#lab-stop-button")
    expect(page.locator('#lab-status[data-status="cancelled"]')).to_be_attached(timeout=RUN_TIMEOUT)
    # ws-client closes the socket after the terminal event: once closed, nothing more can arrive.
    page.wait_for_function("window.__labSockets.every((s) => s.readyState === WebSocket.CLOSED)")
    received = frames(page)
    cancelled = [i for i, f in enumerate(received) if f["type"] == "cancelled"]
    assert len(cancelled) == 1 and received[cancelled[0]]["cause"] == "client"
    assert not [f for f in received[cancelled[0] + 1 :] if f["type"] == "token"]
    n = received[cancelled[0]]["tokens"]
    assert 3 <= n < 400
    expect(page.locator("#lab-status")).to_contain_text(f"Did not finish: cancelled during decode after {n} tokens")
    expect(page.locator("#lab-answer .lab-answer-end")).to_contain_text(f"stopped after {n} tokens")
    assert page.locator("#lab-answer").get_attribute("data-complete") == "false"
    expect(page.locator("#lab-answer .atok")).to_have_count(n)
    expect(page.locator("#lab-history-table tbody tr").first).to_contain_text(f"cancelled after {n} tokens")
    assert console_errors == []


def points(page, card: str, series: str, chart=".lab-exp-chart"):
    return [
        (float(c.get_attribute("data-x")), float(c.get_attribute("data-y")))
        for c in page.locator(f'[data-experiment="{card}"] {chart} [data-series="{series}"] circle').all()
    ]


def run_experiment(page, key: str):
    card = page.locator(f'.lab-exp[data-experiment="{key}"]')
    card.locator(".lab-exp-run").click()
    expect(card).to_have_attribute("data-state", re.compile("done|incomplete|failed"), timeout=EXPERIMENT_TIMEOUT)
    assert card.get_attribute("data-state") == "done", card.locator(".lab-exp-status").inner_text()
    return card


def test_real_kv_experiment_cache_off_steps_rise_with_position(real_server, page, console_errors):
    open_lab(page, real_server)
    run_experiment(page, "kv")
    off, on = points(page, "kv", "cache off"), points(page, "kv", "cache on")
    assert len(off) == len(on) == 4 * 7  # four prompts, seven decode steps each
    assert max(x for x, _ in off) > 5 * min(x for x, _ in off)  # positions span a wide range

    # Without the cache each step recomputes the whole sequence: its time rises with position.
    # The CPU is shared, so other processes slow random steps, often several-fold: the fastest step
    # at the shortest and the longest prompt, the least disturbed ones, carry the trend.
    def fastest(pts):
        return min(y for _, y in pts)

    shortest, longest = off[:7], off[-7:]
    assert fastest(longest) > fastest(shortest)
    assert fastest(longest) > fastest(on[-7:])
    expect(page.locator('[data-experiment="kv"] .lab-exp-summary')).to_contain_text(
        "Without the cache the fastest step took"
    )
    shoot(page, "lab-exp-kv", '[data-experiment="kv"]')
    assert console_errors == []


def test_real_delivery_experiment_buffered_text_comes_with_the_finish(real_server, page, console_errors):
    open_lab(page, real_server)
    run_experiment(page, "delivery")
    lanes = {
        name: page.locator(f'[data-experiment="delivery"] [data-lane="{name}"]') for name in ("stream", "buffered")
    }
    first_text = {n: float(lane.locator(".chart-mark").get_attribute("data-at")) for n, lane in lanes.items()}
    ends = {
        n: max(float(r.get_attribute("data-to")) for r in lane.locator(".chart-seg").all()) for n, lane in lanes.items()
    }
    assert first_text["stream"] < ends["stream"]
    assert first_text["buffered"] == ends["buffered"]
    assert lanes["buffered"].locator(".chart-seg-receiving").count() == 0
    expect(page.locator('[data-experiment="delivery"] .lab-exp-summary')).to_contain_text(
        "the text came with the finish"
    )
    shoot(page, "lab-exp-delivery", '[data-experiment="delivery"]')
    assert console_errors == []


def test_real_prompt_sweep_plots_ttft_and_estimates(real_server, page, console_errors):
    open_lab(page, real_server)
    run_experiment(page, "sweep")
    ttft = points(page, "sweep", "TTFT")
    assert len(ttft) == 5 and [x for x, _ in ttft] == sorted(x for x, _ in ttft)
    assert ttft[-1][0] > 5 * ttft[0][0]  # the prompts really do span a wide range
    # A longer prompt takes longer to prefill. (Prefill time, not TTFT: TTFT also holds any queue wait,
    # e.g. behind a step of the previous test's request that was still finishing.)
    prefill_ms = points(page, "sweep", "prefill time")
    assert prefill_ms[-1][1] > prefill_ms[0][1]
    chart2 = ".lab-exp-chart-2"
    prefill, decode = points(page, "sweep", "prefill (est.)", chart2), points(page, "sweep", "decode (est.)", chart2)
    assert len(prefill) == len(decode) == 5
    assert prefill[-1][1] > decode[-1][1]  # prefill does far more arithmetic per second than decode
    table = page.locator('[data-experiment="sweep"] .lab-exp-table')
    expect(table).to_contain_text("estimate")
    expect(table.locator("tbody tr")).to_have_count(5)
    shoot(page, "lab-exp-sweep", '[data-experiment="sweep"]')
    assert console_errors == []


def test_real_two_requests_are_batched_and_share_decode_steps(real_server, page, console_errors):
    open_lab(page, real_server)
    card = run_experiment(page, "concurrent")

    def segs(lane, kind):
        return page.locator(f'[data-experiment="concurrent"] [data-lane="{lane}"] .chart-seg-{kind}')

    # B joined the batch while A decoded: its prefill began long before A's decode ended.
    a_decode_end = float(segs("A", "decode").get_attribute("data-to"))
    assert float(segs("B", "prefill").get_attribute("data-from")) < a_decode_end
    b_id = frames(page, "accepted")[-1]["request_id"]
    b_tokens = [f for f in frames(page, "token") if f["request_id"] == b_id and f["index"] > 0]
    shared = [t for t in b_tokens if t["batch_size"] == 2]
    assert len(shared) >= len(b_tokens) // 2, "most of B's decode steps also computed A's token"
    expect(card.locator(".lab-exp-summary")).to_contain_text(re.compile(r"B (waited in the queue|started at once)"))
    expect(card.locator(".lab-exp-summary")).to_contain_text(f"{len(shared)} of its decode steps computed")
    shoot(page, "lab-exp-concurrent", '[data-experiment="concurrent"]')
    assert console_errors == []
