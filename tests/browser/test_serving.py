"""The "Many requests at once" chapter in Debian's Chromium: every stage draws the recorded trace (here the
fixed test fixture tests/data/serving-fixture.json, served in place of static/data/serving-trace.json) with
the fixture's own values, and a live run on the fake-model server (POST /api/experiments/<name>) with the
values the server answered; scrolling drives the stages and back restores them; controls, keyboard, deep
links and reduced motion work; without a trace no number is shown; the worked example's math holds."""

from __future__ import annotations

import json
import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest
from js_format import fixed, fmt_ms
from kvscope_testkit import screenshot
from playwright.sync_api import expect
from test_provenance import KINDS, STRUCTURAL, WALK

from serving_experiments.contract import check_response, check_trace

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_TEXT = (ROOT / "tests/data/serving-fixture.json").read_text(encoding="utf-8")
FIXTURE = json.loads(FIXTURE_TEXT)
EXP = {name: response["result"] for name, response in FIXTURE["experiments"].items()}
STAGES = ["why-batch", "batching", "paged", "chunked", "prefix", "attention-cost", "speculative", "disagg", "worked"]
EXPERIMENT = {
    "why-batch": "why_batch",
    "batching": "batching",
    "paged": "paged_blocks",
    "chunked": "chunked_prefill",
    "prefix": "prefix_caching",
    "attention-cost": "attention_cost",
    "speculative": "speculative",
    "worked": "pricing",
}
NARROW, WIDE = {"width": 375, "height": 740}, {"width": 1440, "height": 900}
FIGURE = ".sv-figure"
CHAPTER_STRUCTURE = STRUCTURAL + [".sv-stage-list", ".sv-stage-num"]  # stage numbers are structure
TRACE_GLOB = "**/serving-trace.json"


def serve_trace(page, text: str | None = FIXTURE_TEXT) -> None:
    """The page asks for static/data/serving-trace.json; the test answers with the fixture (or a 404)."""
    if text is None:
        page.route(TRACE_GLOB, lambda route: route.fulfill(status=404, body="not found"))
    else:
        page.route(TRACE_GLOB, lambda route: route.fulfill(status=200, body=text, content_type="application/json"))


def open_chapter(page, server, viewport=WIDE, hash_="#serving", trace: str | None = FIXTURE_TEXT, source="recorded"):
    serve_trace(page, trace)
    page.set_viewport_size(viewport)
    page.goto(server.url + "/" + hash_)
    expect(page.locator(FIGURE)).to_have_attribute("data-source", source)


def show(page, stage: str) -> None:
    page.locator(f'.sv-stage-list button[data-stage="{stage}"]').click()
    expect(page.locator(FIGURE)).to_have_attribute("data-stage", stage)


def panel(page, stage: str):
    return page.locator(f'.sv-panel[data-panel="{stage}"]')


def bar_fraction(locator) -> list[float]:
    """Each bar's drawn length as a share of its track."""
    return locator.evaluate_all(
        "(bars) => bars.map((b) => b.getBoundingClientRect().width / b.parentElement.clientWidth)"
    )


def approx(a: list[float], b: list[float], tol=0.01) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b))


# ---- what each stage must draw for a given result --------------------------------------------------


def check_why_batch(page, r: dict) -> None:
    p = panel(page, "why-batch")
    agg = [pt["aggregate_tps"] for pt in r["points"]]
    bars = p.locator(".sv-agg .sv-bar")
    assert [float(v) for v in bars.evaluate_all("(bs) => bs.map((b) => b.dataset.value)")] == agg
    assert approx(bar_fraction(bars), [a / max(agg) for a in agg])
    assert p.locator(".sv-agg .sv-bar-value").all_text_contents() == [f"{fixed(a, 1)} tok/s" for a in agg]
    per = [pt["per_user_tps"] for pt in r["points"]]
    assert approx(bar_fraction(p.locator(".sv-per .sv-bar")), [v / max(per) for v in per])
    assert p.locator(".sv-per .sv-bar-note").all_text_contents() == [fmt_ms(pt["step_ms"]) for pt in r["points"]]
    drawn = p.locator(".sv-rpoint").evaluate_all(
        "(gs) => gs.map((g) => { const c = g.querySelector('circle').getBoundingClientRect();"
        " return [g.dataset.phase, +g.dataset.intensity, c.x + c.width / 2]; })"
    )
    wanted = r["roofline"]["points"]
    assert [(d[0], d[1]) for d in drawn] == [(w["phase"], w["intensity"]) for w in wanted]
    by_intensity = sorted(drawn, key=lambda d: d[1])
    assert [d[2] for d in by_intensity] == sorted(d[2] for d in drawn), "higher intensity sits further right"


def check_batching(page, r: dict) -> None:
    p = panel(page, "batching")
    order = [w["request"] for w in r["workload"]]
    for name, run in r["runs"].items():
        cells = p.locator(f'.sv-grid[data-run="{name}"] .sv-cell[data-state]').evaluate_all(
            "(cs) => cs.map((c) => c.dataset.state)"
        )
        assert cells == [step["cells"].get(req, "done") for req in order for step in run["steps"]], name
        col = p.locator(f'.sv-col[data-run="{name}"]')
        assert col.locator('[data-key="throughput"]').text_content() == f"{fixed(run['throughput_tps'], 1)} tok/s"
        assert col.locator('[data-key="p95"]').text_content() == fmt_ms(run["p95_latency_ms"])
        assert col.locator('[data-key="idle"]').text_content() == f"{fixed(run['idle_slot_share'] * 100, 1)} %"
        free = col.locator(".sv-free").evaluate_all("(cs) => cs.map((c) => +c.dataset.free)")
        running = [sum(c in ("prefill", "decode") for c in s["cells"].values()) for s in run["steps"]]
        assert free == [r["batch_size"] - n for n in running], f"{name}: idle slots per step"


def owners_drawn(page) -> list:
    return (
        panel(page, "paged")
        .locator(".sv-block")
        .evaluate_all("(bs) => bs.map((b) => b.classList.contains('is-free') ? null : b.dataset.owner)")
    )


def check_paged(page, r: dict) -> None:
    p = panel(page, "paged")
    held = [sum(o is not None for o in f["owners"]) for f in r["frames"]]
    ids = r.get("block_ids") or list(range(len(r["frames"][0]["owners"])))

    def check_frame(frame: dict) -> None:
        assert owners_drawn(page) == frame["owners"]
        shared = [i for i, b in enumerate(ids) if b in frame["shared"]]
        assert p.locator(".sv-block.is-shared").evaluate_all("(bs) => bs.map((b) => +b.dataset.block)") == shared

    check_frame(r["frames"][held.index(max(held))])  # the map opens where the most blocks are held
    slider = p.locator(".sv-slider input")
    slider.focus()
    page.keyboard.press("Home")
    check_frame(r["frames"][0])
    expect(slider).to_have_attribute("aria-valuetext", re.compile(rf"^frame 1 of {len(r['frames'])}, step"))
    page.keyboard.press("End")
    check_frame(r["frames"][-1])
    values = [r["used_bytes"], r["reserved_bytes"], r["contiguous_bytes"]] + (
        [r["window_bytes"]] if "window_bytes" in r else []
    )
    bars = p.locator(".sv-bars .sv-bar")
    assert [float(v) for v in bars.evaluate_all("(bs) => bs.map((b) => b.dataset.value)")] == values
    assert approx(bar_fraction(bars), [v / max(values) for v in values])
    prov = p.locator(".sv-bar-value").evaluate_all("(vs) => vs.map((v) => v.dataset.provenance)")
    # positions × bytes, blocks × bytes, reservations: all worked out from the pool's counts
    assert prov == ["computed"] * len(values), "bytes from counts are computed, not measured"


def check_chunked(page, r: dict) -> None:
    p = panel(page, "chunked")
    top = max(g for run in r["runs"].values() for row in run["gaps_ms"] for g in row)
    for name, run in r["runs"].items():
        gaps = p.locator(f'.sv-gaps[data-run="{name}"] .sv-gap')
        assert [float(v) for v in gaps.evaluate_all("(gs) => gs.map((g) => g.dataset.value)")] == [
            g for row in run["gaps_ms"] for g in row
        ]
        heights = gaps.evaluate_all(
            "(gs) => gs.map((g) => g.getBoundingClientRect().height / g.parentElement.clientHeight)"
        )
        assert approx(heights, [g / top for row in run["gaps_ms"] for g in row], tol=0.04)
        col = p.locator(f'.sv-col[data-run="{name}"]')
        assert col.locator('[data-key="max"]').text_content() == fmt_ms(run["max_gap_ms"])
        assert col.locator('[data-key="ttft"]').text_content() == fmt_ms(run["long_ttft_ms"])


def check_prefix(page, r: dict) -> None:
    p = panel(page, "prefix")
    all_ttft = [q["ttft_ms"] for run in r["runs"].values() for q in run["requests"]]
    for name, run in r["runs"].items():
        col = p.locator(f'.sv-col[data-run="{name}"]')
        ttft = [q["ttft_ms"] for q in run["requests"]]
        assert col.locator(".sv-bar-value").all_text_contents() == [fmt_ms(t) for t in ttft]
        assert approx(bar_fraction(col.locator(".sv-bar")), [t / max(all_ttft) for t in ttft])
        rows = col.locator("tbody tr").evaluate_all(
            "(rs) => rs.map((r) => [...r.cells].slice(1).map((c) => c.textContent))"
        )
        assert rows == [
            [f"{q['prefill_tokens']:,}", f"{q['cached_tokens']:,}", f"{q['shared_blocks']:,}"] for q in run["requests"]
        ]


def fmt_int(x: float) -> str:
    """static/js/shared/format.js formatInt: Math.round (half up), en-US grouping."""
    return f"{int(Decimal(x).quantize(Decimal(1), rounding=ROUND_HALF_UP)):,}"


def line_through(a: tuple[float, float], b: tuple[float, float]):
    """The linear map a drawn axis is, from two (value, pixel) pairs."""
    return lambda v: a[1] + (v - a[0]) * (b[1] - a[1]) / (b[0] - a[0])


def check_attention_cost(page, r: dict) -> None:
    p = panel(page, "attention-cost")
    drawn = p.locator(".sv-apoint").evaluate_all(
        "(gs) => gs.map((g) => { const c = g.querySelector('.sv-best').getBoundingClientRect();"
        " return [+g.dataset.positions, +g.dataset.ms, c.x + c.width / 2, c.y + c.height / 2]; })"
    )
    timed = [pt for pt in r["points"] if pt["step_ms"] is not None]
    assert [(d[0], d[1]) for d in drawn] == [(pt["cached_positions"], pt["step_ms"]) for pt in timed]
    assert [d[2] for d in drawn] == sorted(d[2] for d in drawn), "more cached positions sit further right"
    x = line_through((drawn[0][0], drawn[0][2]), (drawn[-1][0], drawn[-1][2]))
    low, high = min(drawn, key=lambda d: d[1]), max(drawn, key=lambda d: d[1])
    assert high[1] > low[1], "the points' step times differ, so the y axis can be read back"
    y = line_through((low[1], low[3]), (high[1], high[3]))
    for d in drawn[1:-1]:  # every point on the same two linear axes
        assert abs(x(d[0]) - d[2]) < 1 and abs(y(d[1]) - d[3]) < 1, d
    floor = p.locator("line.sv-floor").evaluate(
        "(l) => { const b = l.getBoundingClientRect(); return [b.y, b.height]; }"
    )
    assert floor[1] < 1 and abs(floor[0] - y(r["floor"]["floor_ms"])) < 1.5, "the floor is drawn at its ms"
    fit = p.locator("line.sv-fit").evaluate(
        "(l) => { const m = l.getScreenCTM(); const at = (a, b) => new DOMPoint(+l.getAttribute(a), +l.getAttribute(b)).matrixTransform(m);"
        " const s = at('x1', 'y1'), e = at('x2', 'y2'); return [s.x, s.y, e.x, e.y]; }"
    )
    assert abs(fit[0] - x(0)) < 1 and abs(fit[1] - y(r["fit"]["intercept_ms"])) < 1, "the fit starts at its intercept"
    slope_ms = r["fit"]["slope_us_per_1k_positions"] / 1e6
    end = (fit[3] - fit[1]) / (fit[2] - fit[0])
    assert abs(end - (y(1) - y(0)) * slope_ms / (x(1) - x(0))) < 1e-3 * abs(end) + 1e-6, "the fit has its slope"
    labels = p.locator("svg text.sv-rlabel").evaluate_all(
        "(ts) => ts.map((t) => [t.textContent, t.dataset.provenance])"
    )
    assert [f"weights-only floor {fmt_ms(r['floor']['floor_ms'])}, computed", "computed"] in labels
    assert [
        f"line fitted to the measured steps, computed: {fmt_ms(r['fit']['intercept_ms'])} at no cache",
        "computed",
    ] in labels
    readout = {k: p.locator(f'[data-key="{k}"]') for k in ("slope", "intercept", "floor", "kv-slope")}
    assert readout["floor"].text_content() == fmt_ms(r["floor"]["floor_ms"])
    assert readout["floor"].get_attribute("data-provenance") == "computed"
    assert readout["intercept"].text_content() == fmt_ms(r["fit"]["intercept_ms"])
    assert readout["slope"].text_content() == f"{fmt_int(r['fit']['slope_us_per_1k_positions'])} µs per 1,000 positions"
    assert (
        readout["kv-slope"].text_content() == f"{fmt_int(r['floor']['kv_us_per_1k_positions'])} µs per 1,000 positions"
    )
    rows = p.locator(".sv-attn-table tbody tr").evaluate_all(
        "(rs) => rs.map((r) => [...r.cells].slice(1, 4).map((c) => c.textContent))"
    )
    assert rows == [
        [fmt_int(q["cached_positions"]), fmt_ms(q["step_ms"]), fmt_ms(q["step_ms_median"])] for q in r["points"]
    ]
    if r.get("stopped"):
        expect(p.locator(".sv-attn-stopped")).to_contain_text(r["stopped"])


def check_speculative(page, r: dict) -> None:
    p = panel(page, "speculative")
    for case in r["cases"]:
        box = p.locator(f'.sv-spec-case[data-kind="{case["kind"]}"]')
        assert box.locator("q").text_content() == case["prompt"]  # model-facing text, as text
        chips = box.locator(".sv-spec-steps li").evaluate_all(
            "(ls) => ls.map((l) => [...l.children].map((c) => [c.dataset.token, c.dataset.kind]))"
        )
        wanted = []
        for step in case["steps"]:
            row = [[t, "accepted" if i < step["accepted"] else "rejected"] for i, t in enumerate(step["proposed"])]
            wanted.append(row + ([[step["bonus"], "bonus"]] if step["bonus"] is not None else []))
        assert chips == wanted
        assert box.locator('[data-key="rate"]').text_content() == f"{fixed(case['acceptance_rate'] * 100, 0)} %"
        assert box.locator('[data-key="speedup"]').text_content() == f"×{fixed(case['speedup'], 2)}"


def check_worked(page, r: dict) -> None:
    p = panel(page, "worked")
    assert p.locator(".sv-price-ratio").text_content() == f"{fixed(r['ratio'], 1)} times"
    values = [r["prefill_ms_per_token"], r["decode_ms_per_token"]]
    bars = p.locator(".sv-pricing .sv-bar")
    assert approx(bar_fraction(bars), [v / max(values) for v in values])


def check_disagg(page, chunked: dict) -> None:
    p = panel(page, "disagg")
    expect(page.locator(".sv-source .tag-schematic")).to_have_count(1)
    assert p.locator(".sv-disagg").count() == 1
    assert fmt_ms(chunked["runs"]["off"]["max_gap_ms"]) in p.locator(".sv-tie").text_content()
    expect(page.locator(".sv-source")).to_contain_text("Schematic")


CHECKS = {
    "why-batch": check_why_batch,
    "batching": check_batching,
    "paged": check_paged,
    "chunked": check_chunked,
    "prefix": check_prefix,
    "attention-cost": check_attention_cost,
    "speculative": check_speculative,
    "worked": check_worked,
}


# ---- the recorded trace -------------------------------------------------------------------------------


def test_the_fixture_fits_the_experiments_contract():
    """The fixture is checked by the backend's own validator, so the page is tested on the real shape."""
    assert check_trace(FIXTURE) == []
    assert "fixture" in FIXTURE["recorded_on"]["machine"], "the fixture says it is one"


@pytest.mark.parametrize("viewport", [WIDE, NARROW], ids=["1440", "375"])
def test_each_stage_replays_the_recorded_trace_with_its_values(page, fake_server, console_errors, viewport):
    open_chapter(page, fake_server, viewport)
    for stage in STAGES:
        show(page, stage)
        expect(panel(page, stage)).to_be_visible()
        assert page.locator(".sv-panel:not([hidden])").count() == 1
        if stage == "disagg":
            check_disagg(page, EXP["chunked_prefill"])
        else:
            expect(page.locator(FIGURE)).to_have_attribute("data-source", "recorded")
            expect(page.locator(".sv-source")).to_contain_text(FIXTURE["recorded_on"]["machine"])
            CHECKS[stage](page, EXP[EXPERIMENT[stage]])
        if stage == "batching":
            idle = panel(page, "batching").locator('.sv-grid[data-run="static"] .sv-cell.is-idle')
            assert idle.count() == 5, "the fixture's static run holds five idle slots (finished, batch not done)"
        screenshot(page, f"serving-{stage}-{viewport['width']}")
    overflow = page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0
    assert console_errors == []


SHIPPED = ROOT / "static/data/serving-trace.json"


def test_the_page_draws_the_shipped_trace_or_offers_live_runs_only(page, fake_server):
    """No route here: what the server really ships. With the recorded trace every stage draws its values;
    without it (before scripts/record_serving_trace.py has run) no stage shows a number."""
    shipped = json.loads(SHIPPED.read_text(encoding="utf-8")) if SHIPPED.exists() else None
    page.set_viewport_size(WIDE)
    page.goto(fake_server.url + "/#serving")
    expect(page.locator(FIGURE)).to_have_attribute("data-source", "recorded" if shipped else "none")
    for stage in STAGES:
        show(page, stage)
        if stage == "disagg":
            continue
        if shipped:
            CHECKS[stage](page, shipped["experiments"][EXPERIMENT[stage]]["result"])
            # an experiment merged in later (record_serving_trace.py --only) is dated by its own run
            on = shipped["recorded_on"]
            merged = [m for m in on.get("merged", []) if EXPERIMENT[stage] in m["experiments"]]
            expect(page.locator(".sv-source")).to_contain_text(merged[-1]["date"] if merged else on["date"])
            assert page.evaluate(WALK, ["#serving", CHAPTER_STRUCTURE, KINDS]) == [], stage
        else:
            expect(panel(page, stage).locator(".sv-empty:visible")).to_contain_text("Run it for real")


def test_model_text_is_shown_as_text(page, fake_server, console_errors):
    trace = json.loads(FIXTURE_TEXT)
    case = trace["experiments"]["speculative"]["result"]["cases"][0]
    case["steps"][1]["proposed"][0] = "<img src=x onerror=window.__pwned=1>"
    case["steps"][1]["bonus"] = "\n"
    open_chapter(page, fake_server, trace=json.dumps(trace))
    show(page, "speculative")
    chips = panel(page, "speculative").locator(".sv-chip[data-token]")
    expect(chips.nth(1)).to_have_text("<img src=x onerror=window.__pwned=1>")  # after the prefill's token
    assert panel(page, "speculative").locator("img").count() == 0
    assert page.evaluate("window.__pwned") is None
    assert "↵" in chips.all_text_contents(), "a line-break token is made visible"
    assert console_errors == []


def test_without_a_recorded_trace_no_number_is_shown(page, fake_server):
    open_chapter(page, fake_server, trace=None, source="none")
    expect(page.locator(".sv-run-status")).to_contain_text("No recorded run")
    for stage in STAGES:
        show(page, stage)
        p = panel(page, stage)
        if stage == "disagg":
            expect(p.locator(".sv-tie")).to_contain_text("stall")
            assert not re.search(r"\d", p.locator(".sv-tie").text_content())
            continue
        expect(page.locator(FIGURE)).to_have_attribute("data-source", "none")
        expect(p.locator(".sv-empty:visible")).to_contain_text("Run it for real")
        assert p.locator(".tag-measured, [data-provenance='measured']").count() == 0, stage
        expect(page.locator(".sv-run")).to_be_visible()
    # The worked example's arithmetic needs no run.
    expect(panel(page, "worked").locator(".sv-nocache .sv-bar-value")).to_have_text("625,250")


# ---- stages: scrolling, controls, keyboard, links, motion ----------------------------------------


def reading_line(page) -> float:
    width, height = page.viewport_size["width"], page.viewport_size["height"]
    return height * (0.5 if width >= 900 else 0.8)


def settle(page) -> None:
    page.evaluate("""() => new Promise((done) => {
      let last = -1, still = 0;
      const check = () => { if (scrollY === last && ++still >= 3) done(); else { if (scrollY !== last) still = 0; last = scrollY; requestAnimationFrame(check); } };
      requestAnimationFrame(check); })""")


def visible_panel(page) -> dict:
    return page.evaluate("""() => {
      const f = document.querySelector('.sv-figure');
      const p = f.querySelector('.sv-panel:not([hidden])');
      return { stage: f.dataset.stage, panel: p.dataset.panel, html: p.innerHTML,
               title: f.querySelector('.sv-stage-name').textContent };
    }""")


def scroll_through(page, wanted: list[str], direction=1):
    seen, states = [], {}
    for _ in range(500):
        settle(page)
        expected = page.evaluate(
            """(line) => {
          const steps = [...document.querySelectorAll('.sv-step')];
          let i = 0; steps.forEach((s, k) => { if (s.getBoundingClientRect().top <= line) i = k; });
          return steps[i].dataset.stage; }""",
            reading_line(page),
        )
        expect(page.locator(FIGURE)).to_have_attribute("data-stage", expected)
        if not seen or seen[-1] != expected:
            seen.append(expected)
            states[expected] = visible_panel(page)
        if expected == wanted[-1]:
            break
        page.mouse.wheel(0, 200 * direction)
    return seen, states


@pytest.mark.parametrize("viewport", [WIDE, NARROW], ids=["1440", "375"])
def test_scrolling_activates_every_stage_and_back_restores_it(page, fake_server, console_errors, viewport):
    open_chapter(page, fake_server, viewport)
    page.mouse.move(60, viewport["height"] - 20)  # over the story text
    page.locator("#serving-why-batch").scroll_into_view_if_needed()
    page.evaluate("window.scrollBy(0, -window.innerHeight)")  # the first step just below the reading line
    settle(page)
    down, states = scroll_through(page, STAGES)
    assert down == STAGES
    for stage in STAGES:
        assert states[stage]["panel"] == stage
    up, back = scroll_through(page, STAGES[::-1], direction=-1)
    assert up == STAGES[::-1]
    for stage in STAGES:
        assert back[stage] == states[stage], f"scrolling back to {stage} did not restore it"
    assert console_errors == []


@pytest.mark.parametrize("viewport", [WIDE, NARROW], ids=["1440", "375"])
def test_controls_keyboard_and_deep_links(page, fake_server, console_errors, viewport):
    open_chapter(page, fake_server, viewport, hash_="#serving-prefix")
    figure = page.locator(FIGURE)
    expect(figure).to_have_attribute("data-stage", "prefix")
    expect(page.locator("#serving-prefix")).to_have_class(re.compile(r"\bis-active\b"))
    step = page.locator("#serving-prefix").bounding_box()
    assert step["y"] < viewport["height"] and step["y"] + step["height"] > 0, "the linked step is on screen"
    check_prefix(page, EXP["prefix_caching"])

    page.locator(".sv-next").click()
    expect(figure).to_have_attribute("data-stage", "attention-cost")
    assert page.evaluate("location.hash") == "#serving-attention-cost"
    page.locator(".sv-prev").click()
    page.locator(".sv-prev").click()
    expect(figure).to_have_attribute("data-stage", "chunked")
    expect(page.locator('.sv-stage-list button[aria-current="step"]')).to_have_attribute("data-stage", "chunked")
    step = page.locator("#serving-chunked").bounding_box()
    assert step["y"] <= reading_line(page) <= step["y"] + step["height"], "the story moved to the chosen stage"

    figure.focus()
    for key, stage in [
        ("End", "worked"),
        ("Home", "why-batch"),
        ("PageDown", "batching"),
        ("ArrowRight", "paged"),
        ("ArrowDown", "chunked"),
        ("ArrowLeft", "paged"),
        ("ArrowUp", "batching"),
        ("PageUp", "why-batch"),
        ("End", "worked"),
        ("ArrowUp", "disagg"),
        ("PageUp", "speculative"),
        ("ArrowLeft", "attention-cost"),  # the keys reach the new stage between prefix caching and speculation
        ("ArrowLeft", "prefix"),
        ("ArrowRight", "attention-cost"),
    ]:
        page.keyboard.press(key)
        expect(figure).to_have_attribute("data-stage", stage)
    check_attention_cost(page, EXP["attention_cost"])
    page.keyboard.press("Home")
    expect(page.locator(".sv-prev")).to_be_disabled()
    # The page's own links go both ways between this stage and the calculator.
    page.locator("#serving-paged a.sv-to-calculator").click()
    assert page.evaluate("location.hash") == "#calculator"
    assert page.locator('#calculator a[href="#serving-paged"]').count() == 1
    page.evaluate("location.hash = '#serving-paged'")
    expect(figure).to_have_attribute("data-stage", "paged")
    assert console_errors == []


@pytest.mark.parametrize("motion", ["reduce", "no-preference"])
def test_reduced_motion_changes_state_without_transitions(page, fake_server, console_errors, motion):
    page.emulate_media(reduced_motion=motion)
    open_chapter(page, fake_server)
    show(page, "batching")
    show(page, "why-batch")
    check_why_batch(page, EXP["why_batch"])  # the same state either way
    durations = page.evaluate("""() => [...document.querySelectorAll('.sv-panel:not([hidden]) .sv-bar')]
      .map((b) => getComputedStyle(b).transitionDuration).concat(getComputedStyle(document.querySelector('.sv-step')).transitionDuration)""")
    if motion == "reduce":
        assert set(durations) == {"0s"}
    else:
        assert "0s" not in durations
    assert console_errors == []


# ---- provenance and the worked examples ------------------------------------------------------------


@pytest.mark.parametrize("viewport", [WIDE, NARROW], ids=["1440", "375"])
def test_every_number_in_the_chapter_is_labelled(page, fake_server, console_errors, viewport):
    open_chapter(page, fake_server, viewport)
    for stage in STAGES:
        show(page, stage)
        bad = page.evaluate(WALK, ["#serving", CHAPTER_STRUCTURE, KINDS])
        assert bad == [], f"stage {stage}:\n" + "\n".join(bad)
    assert console_errors == []


def test_worked_example_counts_token_passes(page, fake_server, console_errors):
    open_chapter(page, fake_server, hash_="#serving-worked")
    p = panel(page, "worked")
    no_cache, with_cache = p.locator(".sv-nocache .sv-bar-value"), p.locator(".sv-withcache .sv-bar-value")
    # The reference text's example: 1,000-token prompt, 500-token reply.
    expect(no_cache).to_have_text("625,250")
    expect(with_cache).to_have_text("1,500")
    expect(p.locator(".sv-ratio")).to_have_text("416 times")  # rounded down, as the reference text's code prints it
    for node in (no_cache, with_cache):
        assert node.get_attribute("data-provenance") == "computed"
    p.locator("#sv-pass-prompt").fill("10")
    p.locator("#sv-pass-reply").fill("4")
    expect(no_cache).to_have_text(f"{sum(10 + i for i in range(1, 5)):,}")  # 11 + 12 + 13 + 14
    expect(with_cache).to_have_text("14")
    p.locator("#sv-pass-reply").fill("0")
    expect(p.locator(".sv-error")).to_have_text("Reply length must be a whole number from 1 to 100,000")
    expect(p.locator("#sv-pass-reply")).to_have_attribute("aria-invalid", "true")
    assert p.locator(".sv-nocache").count() == 0, "no number for a bad input"
    p.locator("#sv-pass-reply").fill("500")
    p.locator("#sv-pass-prompt").fill("1000")
    expect(no_cache).to_have_text("625,250")
    expect(p.locator(".sv-budget-used")).to_have_text("1,238 of 4,096")
    assert console_errors == []


# ---- live runs on the fake-model server -----------------------------------------------------------------


@pytest.fixture
def ignored_console_errors():
    """Besides the favicon probe, the 409 and 400 answers the refusal test provokes on purpose."""
    return ("/favicon.ico", "status of 409", "status of 400")


LIVE = ["why-batch", "batching", "paged", "chunked", "prefix", "attention-cost", "speculative", "worked"]


def test_run_it_for_real_draws_the_servers_answer_for_every_experiment(page, fake_server, console_errors):
    open_chapter(page, fake_server)
    expect(page.locator('#model-status[data-status="ready"]')).to_be_attached(timeout=60_000)
    figure, run = page.locator(FIGURE), page.locator(".sv-run")
    for stage in LIVE:
        show(page, stage)
        expect(run).to_be_enabled(timeout=30_000)
        with page.expect_response(lambda r: r.url.endswith(f"/api/experiments/{EXPERIMENT[stage]}")) as answer:
            run.click()
        response = answer.value.json()
        assert answer.value.status == 200, response
        assert check_response(EXPERIMENT[stage], response) == []
        expect(figure).to_have_attribute("data-source", "live", timeout=60_000)
        expect(page.locator(".sv-source")).to_contain_text("Live run")
        # the decoder that ran the live steps, as the server reports it
        expect(page.locator(".sv-source .sv-decoder")).to_have_text(response["machine"]["decoder"])
        CHECKS[stage](page, response["result"])
        assert page.evaluate(WALK, ["#serving", CHAPTER_STRUCTURE, KINDS]) == [], f"{stage}: unlabelled numbers"
        if stage == "chunked":
            show(page, "disagg")
            check_disagg(page, response["result"])
            show(page, "chunked")
        screenshot(page, f"serving-live-{stage}-1440")
        page.locator(".sv-back").click()  # the recorded run comes back
        expect(figure).to_have_attribute("data-source", "recorded")
        if stage in CHECKS:
            CHECKS[stage](page, EXP[EXPERIMENT[stage]])
    assert console_errors == []


def test_refusals_are_reported_and_the_recorded_run_stays(page, fake_server, console_errors):
    answers = iter(
        [
            (409, {"error": {"code": "busy", "message": "another experiment is running"}}),
            (400, {"code": "invalid_param", "field": "new_tokens", "message": "new_tokens must be from 2 to 16"}),
        ]
    )

    def refuse(route):
        status, body = next(answers)
        route.fulfill(status=status, body=json.dumps(body), content_type="application/json")

    page.route("**/api/experiments/pricing", refuse)
    open_chapter(page, fake_server, hash_="#serving-worked")
    expect(page.locator('#model-status[data-status="ready"]')).to_be_attached(timeout=60_000)
    run = page.locator(".sv-run")
    expect(run).to_be_enabled(timeout=30_000)
    run.click()
    expect(page.locator(".sv-run-status")).to_have_text("Another experiment is running; try again when it ends.")
    expect(run).to_be_enabled()
    run.click()
    expect(page.locator(".sv-run-status")).to_contain_text("(new_tokens): new_tokens must be from 2 to 16")
    expect(page.locator(FIGURE)).to_have_attribute("data-source", "recorded")
    check_worked(page, EXP["pricing"])
    assert console_errors == []


def test_the_math_module_on_its_own(page, fake_server, console_errors):
    """static/js/serving/math.js and shared/roofline.js, imported alone: the arithmetic the figures draw with."""
    serve_trace(page)
    page.goto(fake_server.url + "/")
    got = page.evaluate("""async () => {
      const m = await import('/static/js/serving/math.js');
      const rl0 = await import('/static/js/shared/roofline.js');
      const rl = { peak_flops_s: 2e11, bandwidth_bytes_s: 2e10 };
      return {
        passes: m.tokenPasses(1000, 500), small: m.tokenPasses(3, 2),
        budget: m.contextUse({ content: 1000, template: 38, maxNew: 200, window: 4096 }),
        over: m.contextUse({ content: 3950, template: 0, maxNew: 200, window: 4096 }),
        bad: [m.checkCount('prompt', 0), m.checkCount('reply', 2.5), m.checkCount('prompt', 100000)],
        ridge: rl0.ridge(rl), roof: [rl0.roof(1, rl), rl0.roof(100, rl)], decades: m.decades([0.58, 28.2]),
        free: m.freeSlots({ cells: { A: 'decode', B: 'done', C: 'prefill', D: 'waiting' } }, 3),
        peak: m.peakFrame([{ owners: ['A', null] }, { owners: ['A', 'B'] }, { owners: [null, 'B'] }]),
        tokens: ['\\n', '  ', '', ' the'].map(m.visibleToken),
        chips: m.specChips({ proposed: ['a', 'b', 'c'], accepted: 2, bonus: null }),
      };
    }""")
    assert got["passes"] == {"noCache": 625_250, "withCache": 1_500, "ratio": 625_250 / 1_500}
    assert got["small"]["noCache"] == (3 + 1) + (3 + 2)  # each new token re-reads everything before it
    assert got["budget"] == {"prompt": 1_038, "used": 1_238, "window": 4_096, "fits": True, "free": 2_858}
    assert got["over"]["fits"] is False  # the reference text's 3,950-token prompt + 200 no longer fits
    assert got["bad"] == [
        "Prompt length must be a whole number from 1 to 100,000",
        "Reply length must be a whole number from 1 to 100,000",
        None,
    ]
    assert got["ridge"] == 10 and got["roof"] == [2e10, 2e11]
    assert got["decades"] == [0.1, 100]
    assert got["free"] == 1 and got["peak"] == 1
    assert got["tokens"] == ["↵", "␣␣", "∅", " the"]
    assert got["chips"] == [
        {"text": "a", "kind": "accepted"},
        {"text": "b", "kind": "accepted"},
        {"text": "c", "kind": "rejected"},
    ]
    assert console_errors == []


def test_the_attention_math_module_on_its_own(page, fake_server, console_errors):
    """static/js/serving/attention-cost-math.js, imported alone: the axes and the chart's model of a result."""
    serve_trace(page)
    page.goto(fake_server.url + "/")
    result = EXP["attention_cost"]
    got = page.evaluate(
        """async (result) => {
      const m = await import('/static/js/serving/attention-cost-math.js');
      const s = m.linearScale([0, 10], [100, 200]);
      return { ticks: [m.ticks(8190), m.ticks(37.7), m.ticks(1), m.ticks(0)], scale: [s(0), s(5), s(10)],
               at: m.fitAt({ intercept_ms: 20, slope_us_per_1k_positions: 5000 }, 2000), model: m.chartModel(result) };
    }""",
        result,
    )
    assert got["ticks"] == [[0, 2500, 5000, 7500, 10000], [0, 10, 20, 30, 40], [0, 0.25, 0.5, 0.75, 1], [0, 1]]
    assert got["scale"] == [100, 150, 200]
    assert got["at"] == pytest.approx(30)  # 20 ms + 5 µs a position x 2,000 positions
    model = got["model"]
    assert [q["positions"] for q in model["points"]] == [q["cached_positions"] for q in result["points"]]
    assert (
        model["xMax"] >= max(q["cached_positions"] for q in result["points"]) and model["xTicks"][-1] == model["xMax"]
    )
    assert model["floor"] == result["floor"]["floor_ms"]
    fit = result["fit"]
    assert model["fit"]["y0"] == pytest.approx(fit["intercept_ms"])
    assert model["fit"]["y1"] == pytest.approx(
        fit["intercept_ms"] + fit["slope_us_per_1k_positions"] / 1e6 * model["xMax"]
    )
    assert model["yMax"] >= max(q["step_ms_median"] for q in result["points"])
    assert console_errors == []
