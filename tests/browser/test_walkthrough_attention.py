"""The walkthrough's "what the newest token read" in Chromium: scrolled to the decode and
cache stages, the strip, the figure's token row and its cache columns light exactly the top positions of the recorded
trace's `attention` event for the newest token, for all layers and for layers picked with the slider's
keys (which must not turn the stage), and for an answer token pointed at or focused; a live run on the
fake model asks for inspection and lights its own events. Screenshots at 375 and 1440 px."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvscope_testkit import screenshot
from playwright.sync_api import expect
from test_lab import RECORD_FRAMES, frames
from walkthrough_page import STAGES

ROOT = Path(__file__).resolve().parents[2]
TRACE = json.loads((ROOT / "static/data/trace-example.json").read_text(encoding="utf-8"))
READS = [e for e in TRACE["events"] if e["type"] == "attention"]
NEWEST = READS[-1]
LAYERS = TRACE["model"]["layers"]
NARROW, WIDE = {"width": 375, "height": 740}, {"width": 1440, "height": 900}
FIGURE, BLOCK, STRIP = ".wt-figure", ".wt-attn", ".wt-attn-strip"
STAGES_SEEN = """document.addEventListener('kvscope:stage', (e) => (window.__stages ||= []).push(e.detail.stage));"""


def top_positions(summary: dict) -> list[int]:
    return sorted(p for p, _ in summary["top"])


def lit(page) -> dict:
    """The positions lit in the strip, the figure's token row and its cache lane, and the outlined query."""
    return page.evaluate(f"""() => {{
      const strip = [...document.querySelectorAll('{STRIP} .ptok')];
      const cells = [...document.querySelectorAll('.wt-cells .wt-cell')];
      const columns = [...document.querySelectorAll('.wt-columns .wt-col')];
      return {{
        strip: strip.filter((s) => s.dataset.read !== '0').map((s) => Number(s.dataset.position)).sort((a, b) => a - b),
        cells: cells.map((c, i) => (c.dataset.read ? i : -1)).filter((i) => i >= 0),
        columns: columns.map((c, i) => (c.dataset.read ? i : -1)).filter((i) => i >= 0),
        query: strip.findIndex((s) => s.style.outline.includes('solid')),
        queryCell: cells.findIndex((c) => c.classList.contains('is-query')),
      }};
    }}""")


def assert_lit(page, summary: dict, query: int) -> None:
    shown = lit(page)
    assert shown["strip"] == shown["cells"] == shown["columns"] == top_positions(summary), shown
    assert shown["query"] == shown["queryCell"] == query


def scroll_to_stage(page, stage: str) -> None:
    """Scrolls the story until the stage's step reaches the reading line (scroll.js)."""
    page.evaluate(
        """(stage) => {
      const line = innerHeight * (matchMedia('(min-width: 900px)').matches ? 0.5 : 0.8);
      window.scrollBy(0, document.getElementById(`stage-${stage}`).getBoundingClientRect().top - line + 12);
    }""",
        stage,
    )
    expect(page.locator(FIGURE)).to_have_attribute("data-stage", stage)


def shot(page, name: str) -> None:
    screenshot(page, name)  # into the testkit's artifacts folder, to be opened


@pytest.mark.parametrize("viewport", [WIDE, NARROW], ids=["1440", "375"])
def test_the_recorded_run_lights_what_each_token_read(page, fake_server, console_errors, viewport):
    page.set_viewport_size(viewport)
    page.goto(fake_server.url + "/")
    expect(page.locator(FIGURE)).to_have_attribute("data-source", "recorded")
    block = page.locator(BLOCK)
    expect(block).to_be_hidden()
    scroll_to_stage(page, "decode")
    expect(block).to_be_visible()
    assert_lit(page, NEWEST["all"], NEWEST["query_position"])
    expect(block.locator(".wt-attn-where")).to_contain_text(TRACE["recorded_at"][:10])
    expect(block.locator(".tag-measured")).to_be_visible()
    expect(page.locator(".wt-attn-caption")).to_contain_text(f"answer token {NEWEST['index']}, all layers")
    shot(page, f"walkthrough-attention-decode-{viewport['width']}")

    slider = page.locator("#wt-attn-layer")
    expect(slider).to_have_attribute("max", str(LAYERS))
    slider.focus()
    page.keyboard.press("ArrowRight")
    expect(slider).to_have_attribute("aria-valuetext", "layer 1")
    assert_lit(page, NEWEST["layers"][0]["mean"], NEWEST["query_position"])
    page.keyboard.press("End")  # the slider's own keys: the stage stays
    expect(page.locator(".wt-attn-layer-out")).to_have_text(f"layer {LAYERS}")
    assert_lit(page, NEWEST["layers"][-1]["mean"], NEWEST["query_position"])
    expect(page.locator(FIGURE)).to_have_attribute("data-stage", "decode")

    # what an earlier answer token read: pointed at, then reached with the keyboard
    page.locator(f'{STRIP} [data-index="3"]').hover()
    assert_lit(page, READS[3]["layers"][-1]["mean"], READS[3]["query_position"])
    expect(page.locator(".wt-attn-caption")).to_contain_text(f"answer token 3, layer {LAYERS}")
    page.keyboard.press("Home")  # still on the slider: back to all layers
    expect(slider).to_have_attribute("aria-valuetext", "all layers (mean)")
    assert_lit(page, READS[3]["all"], READS[3]["query_position"])
    page.mouse.move(2, 2)  # off the strip: the newest again
    assert_lit(page, NEWEST["all"], NEWEST["query_position"])
    page.locator(f'{STRIP} [data-index="5"]').focus()
    assert_lit(page, READS[5]["all"], READS[5]["query_position"])

    scroll_to_stage(page, "cache")
    expect(block).to_be_visible()
    assert_lit(page, NEWEST["all"], NEWEST["query_position"])
    shot(page, f"walkthrough-attention-cache-{viewport['width']}")
    scroll_to_stage(page, "delivery")
    expect(block).to_be_hidden()
    assert lit(page)["cells"] == lit(page)["columns"] == [], "outside the decode and cache stages nothing is lit"
    assert console_errors == []


def test_a_live_run_asks_for_inspection_and_lights_its_own_reads(page, fake_server, console_errors):
    page.add_init_script(RECORD_FRAMES)
    page.add_init_script(STAGES_SEEN)
    page.set_viewport_size(WIDE)
    page.goto(fake_server.url + "/")
    run = page.locator(".wt-run")
    expect(run).to_be_enabled(timeout=60_000)
    page.evaluate("window.__stages = []")
    run.click()
    expect(page.locator(".wt-end")).to_be_visible(timeout=120_000)
    # following the run, the figure only moves forward: an attention frame has no stage of its own
    seen = page.evaluate("window.__stages")
    assert seen[-1] == "end" and seen == sorted(seen, key=STAGES.index), seen
    sent = [m for m in page.evaluate("window.__labSent") if m.get("type") == "generate"]
    assert sent[-1]["inspect"] == {"attention": True}
    reads = [f for f in frames(page, "attention") if f["request_id"] == sent[-1]["request_id"]]
    assert len(reads) == sum(1 for f in frames(page, "token") if f["request_id"] == sent[-1]["request_id"]) > 1
    page.locator('.wt-stage-list button[data-stage="decode"]').click()
    expect(page.locator(BLOCK)).to_be_visible()
    expect(page.locator(".wt-attn-where")).to_contain_text("live run")
    assert_lit(page, reads[-1]["all"], reads[-1]["query_position"])
    page.locator("#wt-attn-layer").fill("2")  # the fake model's second (last) layer
    assert_lit(page, reads[-1]["layers"][1]["mean"], reads[-1]["query_position"])
    assert console_errors == []


def test_a_live_run_asks_for_inspection_only_where_the_engine_can_give_it(page, static_url):
    page.goto(static_url + "/static/js/walkthrough/attention.js")
    out = page.evaluate(
        """async (request) => {
      const a = await import('/static/js/walkthrough/attention.js');
      const plain = {...request}; delete plain.inspect;
      return {local: a.liveRequest(plain, {name: 'x'}), remote: a.liveRequest(request, {engine: 'openai'})};
    }""",
        TRACE["request"],
    )
    assert out["local"]["inspect"] == {"attention": True}
    assert "inspect" not in out["remote"], "a remote engine refuses inspection: the run must not ask for it"
    assert out["remote"]["messages"] == TRACE["request"]["messages"]
