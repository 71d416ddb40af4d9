"""The lab's "what each new token read" in Chromium: the pure reducer (static/js/shared/attention.js)
on hand-made events, then a live run on the fake-model server with inspection on, where the lit
positions must be exactly the top positions of the `attention` frames the page received, for all
layers, one layer, the sharpest head and a token pointed at; screenshots at 375 and 1440 px."""

from __future__ import annotations

import pytest
from kvscope_testkit import screenshot
from playwright.sync_api import expect
from test_lab import RECORD_FRAMES, RUN_TIMEOUT, frames

STRIP = "#lab-attn-strip"


def attention_event(index: int, tops: list[list[list[float]]], all_top: list[list[float]]) -> dict:
    layers = [{"mean": {"top": t, "bins": [1.0]}, "sharpest": {"head": 0, "entropy": 0.1, "top": t[:1]}} for t in tops]
    n = max(p for t in tops for p, _ in t) + 1
    return {
        "type": "attention",
        "index": index,
        "query_position": n - 1,
        "positions": n,
        "bin_width": 1,
        "all": {"top": all_top, "bins": [1.0]},
        "layers": layers,
    }


def test_the_reducer_keeps_each_tokens_reads_and_levels_them(page, static_url):
    page.goto(static_url + "/static/js/shared/attention.js")
    event = attention_event(1, [[[0, 0.5], [2, 0.25]], [[1, 0.9], [0, 0.05]]], [[0, 0.4], [1, 0.3], [2, 0.1]])
    out = page.evaluate(
        """async (event) => {
      const a = await import('/static/js/shared/attention.js');
      let s = a.createAttention([{text: '<|im_start|>', source: 'marker'}, {text: 'hi', source: 'user'}]);
      const before = s;
      s = a.applyAttentionEvent(s, {type: 'token', index: 0, id: 5, text: ' A'});
      s = a.applyAttentionEvent(s, event);
      s = a.applyAttentionEvent(s, {type: 'queued', position: 1});
      return {
        pure: before.answer.length === 0 && Object.keys(before.reads).length === 0,
        newest: a.newestIndex(s), layers: s.layers,
        all: a.readsFor(s, 1), layer2: a.readsFor(s, 1, 1), sharp: a.readsFor(s, 1, 0, a.HEAD_MODES.SHARPEST),
        none: a.readsFor(s, 7),
        levels: [...a.highlightLevels(a.readsFor(s, 1))],
        at: [a.positionOf(s, 1), a.positionOf(s, 2), a.positionOf(s, 3)],
      };
    }""",
        event,
    )
    assert out["pure"] and out["newest"] == 1 and out["layers"] == 2
    assert out["all"] == [
        {"position": 0, "weight": 0.4},
        {"position": 1, "weight": 0.3},
        {"position": 2, "weight": 0.1},
    ]
    assert out["layer2"] == [{"position": 1, "weight": 0.9}, {"position": 0, "weight": 0.05}]
    assert out["sharp"] == [{"position": 0, "weight": 0.5}] and out["none"] == []
    assert out["levels"] == [[0, 4], [1, 3], [2, 1]]  # ceil(4 × weight ÷ the top weight)
    assert out["at"] == [
        {"kind": "prompt", "source": "user", "text": "hi"},
        {"kind": "answer", "source": "answer", "text": " A", "index": 0},
        None,
    ]


def lit(page) -> list[int]:
    return page.evaluate(
        f"""[...document.querySelectorAll('{STRIP} [data-read]')]
          .filter((s) => s.dataset.read !== '0').map((s) => Number(s.dataset.position)).sort((a, b) => a - b)"""
    )


def positions(top) -> list[int]:
    return sorted(p for p, _ in top)


@pytest.mark.parametrize("width", [375, 1440])
def test_a_live_run_lights_the_positions_the_attention_events_name(fake_server, page, console_errors, width):
    page.set_viewport_size({"width": width, "height": 900})
    page.add_init_script(RECORD_FRAMES)
    page.goto(f"{fake_server.url}/")
    expect(page.locator('#model-status[data-status="ready"]')).to_be_attached(timeout=60_000)
    expect(page.locator("#lab-prompt-tokens .ptok").first).to_be_attached(timeout=60_000)
    page.fill("#lab-max-new", "12")
    page.check("#lab-attn-on")
    page.click("#lab-run")
    expect(page.locator('#lab-status[data-status="finished"]')).to_be_attached(timeout=RUN_TIMEOUT)
    assert page.evaluate("window.__labSent")[-1]["inspect"] == {"attention": True}
    events = frames(page, "attention")
    tokens = frames(page, "token")
    assert [e["index"] for e in events] == [t["index"] for t in tokens] == list(range(12))
    newest, prompt = events[-1], frames(page, "accepted")[0]["prompt_tokens"]
    strip = page.locator(f"{STRIP} .ptok")
    expect(strip).to_have_count(prompt + 12)
    assert lit(page) == positions(newest["all"]["top"])
    query = page.locator(f'{STRIP} [data-position="{newest["query_position"]}"]')
    assert "solid" in query.evaluate("(s) => s.style.outline")

    page.locator("#lab-attn-layer").focus()
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")  # layer 2 of the fake's 2
    expect(page.locator("#lab-attn-layer-out")).to_have_text("layer 2")
    assert lit(page) == positions(newest["layers"][1]["mean"]["top"])
    page.check('input[name="lab-attn-heads"][value="sharpest"]')
    assert lit(page) == positions(newest["layers"][1]["sharpest"]["top"])
    expect(page.locator("#lab-attn-caption")).to_contain_text("sharpest head")

    page.check('input[name="lab-attn-heads"][value="mean"]')
    page.locator(f'{STRIP} [data-index="3"]').focus()  # keyboard: what answer token 3 read
    assert lit(page) == positions(events[3]["layers"][1]["mean"]["top"])
    expect(page.locator("#lab-attn-caption")).to_contain_text("answer token 3")
    page.locator("#lab-attention").scroll_into_view_if_needed()
    screenshot(page, f"attention-{width}")
    assert console_errors == []
