"""The walkthrough in Debian's Chromium: scrolling drives the stages (and back restores them), the
controls, keyboard and `#stage-…` links jump, reduced motion is honoured, a lab run can be shown,
and a live run of the real model plays its events into the figure with measured times."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from kvscope_testkit import screenshot
from playwright.sync_api import expect
from walkthrough_page import STAGES

ROOT = Path(__file__).resolve().parents[2]
TRACE = json.loads((ROOT / "static/data/trace-example.json").read_text(encoding="utf-8"))
NARROW, WIDE = {"width": 375, "height": 740}, {"width": 1440, "height": 900}
FIGURE = ".wt-figure"

# What the recorded run holds, from the shipped file itself.
PROMPT = len(TRACE["prompt"]["tokens"])
TOKENS = [e for e in TRACE["events"] if e["type"] == "token"]
END = TRACE["events"][-1]
PREFILL_END = next(e for e in TRACE["events"] if e["type"] == "prefill_end")


def reading_line(page) -> float:
    """The line where a step becomes the stage: half-way down when wide, 80% down when narrow."""
    width, height = page.viewport_size["width"], page.viewport_size["height"]
    return height * (0.5 if width >= 900 else 0.8)


def open_page(page, server, viewport, hash_=""):
    page.set_viewport_size(viewport)
    page.goto(server.url + "/" + hash_)
    expect(page.locator(FIGURE)).to_have_attribute("data-source", "recorded")


def snapshot(page) -> dict:
    """What the figure shows, read from the page the way a reader sees it."""
    return page.evaluate("""() => {
      const f = document.querySelector('.wt-figure');
      const all = (sel) => [...f.querySelectorAll(sel)];
      return {
        stage: f.dataset.stage,
        promptCells: all('.wt-cell:not(.gen)').length,
        generatedCells: all('.wt-cell.gen').length,
        highlighted: all('.wt-cell.is-hl').length,
        queued: !f.querySelector('.wt-request').classList.contains('is-hidden'),
        prefillDone: f.querySelector('.wt-prefill').classList.contains('is-done'),
        ticks: all('.wt-tick').length,
        cacheColumns: all('.wt-col').length,
        panel: f.querySelector('.wt-panel').dataset.kind,
        panelText: f.querySelector('.wt-panel-body').textContent,
        candidates: all('.wt-cands li').length,
        answerTokens: all('.wt-tok').length,
        bounds: !!f.querySelector('.wt-answer.show-bounds'),
        end: (f.querySelector('.wt-end') || {}).textContent || '',
        endMarkedComplete: !!f.querySelector('.wt-end.complete'),
        readout: f.querySelector('.wt-readout').textContent,
        dimLanes: all('.wt-lane.is-dim').length,
        title: f.querySelector('.wt-stage-name').textContent,
      };
    }""")


# The state each stage must show for the recorded run.
EXPECTED = {
    "input": dict(promptCells=0, generatedCells=0, cacheColumns=0, panel="messages", prefillDone=False),
    "template": dict(promptCells=PROMPT, generatedCells=0, panel="rendered"),
    "tokens": dict(promptCells=PROMPT, panel="tokens"),
    "queue": dict(queued=True, prefillDone=False, cacheColumns=0),
    "prefill": dict(queued=False, prefillDone=True, cacheColumns=PREFILL_END["cache_tokens"], generatedCells=0),
    "first-token": dict(generatedCells=1, candidates=len(PREFILL_END["first_token"]["candidates"]), answerTokens=1),
    "decode": dict(generatedCells=len(TOKENS), ticks=len(TOKENS) - 1, answerTokens=len(TOKENS)),
    "cache": dict(cacheColumns=TOKENS[-1]["cache_tokens"], generatedCells=len(TOKENS)),
    "delivery": dict(bounds=True, answerTokens=len(TOKENS), end=""),
    "end": dict(answerTokens=len(TOKENS)),
    "map": dict(dimLanes=0, prefillDone=True, cacheColumns=TOKENS[-1]["cache_tokens"]),
}


def check_stage(state: dict, stage: str) -> None:
    assert state["stage"] == stage
    for key, value in EXPECTED[stage].items():
        assert state[key] == value, f"{stage}: {key} is {state[key]!r}, expected {value!r}"
    if stage == "tokens":
        assert state["highlighted"] >= 2, "a word cut into several tokens is marked"
    if stage in ("end", "map"):
        assert END["reason"] in state["end"]
        # Only an end token or a stop string ends an answer on its own terms; a budget cuts it short.
        assert state["endMarkedComplete"] == (END["reason"] in ("eos", "stop_string"))
    if stage in ("delivery", "end", "map"):
        assert state["panelText"].startswith(END["text"])


def settle(page) -> None:
    """Waits until the page has stopped scrolling (wheel scrolling may be animated)."""
    page.evaluate("""() => new Promise((done) => {
      let last = -1, still = 0;
      const check = () => { if (scrollY === last && ++still >= 3) done(); else { if (scrollY !== last) still = 0; last = scrollY; requestAnimationFrame(check); } };
      requestAnimationFrame(check); })""")


def scroll_through(page, stages_wanted, direction=1):
    """Scrolls with the mouse wheel in small steps; returns (stages in the order they appeared, state per stage)."""
    seen, states = [], {}
    figure = page.locator(FIGURE)
    for _ in range(400):
        settle(page)
        expected = page.evaluate(
            """(line) => {
          const steps = [...document.querySelectorAll('.wt-step')];
          let i = 0; steps.forEach((s, k) => { if (s.getBoundingClientRect().top <= line + 1) i = k; });
          return steps[i].dataset.stage; }""",
            reading_line(page),
        )
        expect(figure).to_have_attribute("data-stage", expected)
        if not seen or seen[-1] != expected:
            seen.append(expected)
            states[expected] = snapshot(page)
        if expected == stages_wanted[-1]:
            break
        page.mouse.wheel(0, 160 * direction)
    return seen, states


@pytest.mark.parametrize("viewport", [WIDE, NARROW], ids=["1440", "375"])
def test_scrolling_activates_every_stage_in_order_and_back_restores_them(page, fake_server, console_errors, viewport):
    open_page(page, fake_server, viewport)
    page.mouse.move(60, viewport["height"] - 20)  # over the story text
    page.locator("#stage-input").scroll_into_view_if_needed()
    page.evaluate("window.scrollBy(0, -window.innerHeight)")  # the first step just below the reading line

    down, states = scroll_through(page, STAGES)
    assert down == STAGES
    for stage in STAGES:
        check_stage(states[stage], stage)
    screenshot(page, f"walkthrough-map-{viewport['width']}")

    up, states_back = scroll_through(page, STAGES[::-1], direction=-1)
    assert up == STAGES[::-1]
    for stage in STAGES:
        assert states_back[stage] == states[stage], f"scrolling back to {stage} did not restore it"
    assert console_errors == []


@pytest.mark.parametrize("viewport", [WIDE, NARROW], ids=["1440", "375"])
def test_prev_next_stage_list_and_keyboard_jump(page, fake_server, console_errors, viewport):
    open_page(page, fake_server, viewport)
    figure = page.locator(FIGURE)
    page.locator(".wt-next").click()
    expect(figure).to_have_attribute("data-stage", "template")
    page.locator(".wt-next").click()
    expect(figure).to_have_attribute("data-stage", "tokens")
    page.locator(".wt-prev").click()
    expect(figure).to_have_attribute("data-stage", "template")
    assert page.evaluate("location.hash") == "#stage-template"

    page.locator('.wt-stage-list button[data-stage="cache"]').click()
    expect(figure).to_have_attribute("data-stage", "cache")
    expect(page.locator('.wt-stage-list button[aria-current="step"]')).to_have_attribute("data-stage", "cache")
    check_stage(snapshot(page), "cache")
    step = page.locator("#stage-cache").bounding_box()
    assert step["y"] <= reading_line(page) <= step["y"] + step["height"], "the story moved to the chosen stage"
    screenshot(page, f"walkthrough-cache-{viewport['width']}")

    figure.focus()
    for key, stage in [
        ("End", "map"),
        ("Home", "input"),
        ("PageDown", "template"),
        ("ArrowRight", "tokens"),
        ("ArrowDown", "queue"),
        ("ArrowLeft", "tokens"),
        ("ArrowUp", "template"),
        ("PageUp", "input"),
    ]:
        page.keyboard.press(key)
        expect(figure).to_have_attribute("data-stage", stage)
    check_stage(snapshot(page), "input")
    expect(page.locator(".wt-prev")).to_be_disabled()
    assert console_errors == []


@pytest.mark.parametrize("viewport", [WIDE, NARROW], ids=["1440", "375"])
@pytest.mark.parametrize("stage", ["prefill", "first-token", "end"])
def test_stage_link_opens_that_stage(page, fake_server, console_errors, viewport, stage):
    open_page(page, fake_server, viewport, f"#stage-{stage}")
    expect(page.locator(FIGURE)).to_have_attribute("data-stage", stage)
    check_stage(snapshot(page), stage)
    expect(page.locator(f"#stage-{stage}")).to_have_class(re.compile(r"\bis-active\b"))
    step = page.locator(f"#stage-{stage}").bounding_box()
    assert step["y"] < viewport["height"] and step["y"] + step["height"] > 0, "the linked step is on screen"
    screenshot(page, f"walkthrough-{stage}-{viewport['width']}")
    assert console_errors == []


def transition_state(page) -> dict:
    return page.evaluate("""() => {
      const lane = document.querySelector('.wt-lane');
      const prefill = document.querySelector('.wt-prefill');
      return { lane: getComputedStyle(lane).transitionDuration, prefill: getComputedStyle(prefill).transitionDuration,
               newCells: [...document.querySelectorAll('.wt-cell.is-new')].map((c) => getComputedStyle(c).animationName) };
    }""")


@pytest.mark.parametrize("motion", ["reduce", "no-preference"])
def test_reduced_motion_changes_state_without_transitions(page, fake_server, console_errors, motion):
    page.emulate_media(reduced_motion=motion)
    open_page(page, fake_server, WIDE)
    page.locator('.wt-stage-list button[data-stage="decode"]').click()
    expect(page.locator(FIGURE)).to_have_attribute("data-stage", "decode")
    check_stage(snapshot(page), "decode")  # the state itself is the same either way
    styles = transition_state(page)
    assert styles["newCells"], "the decode stage adds cells"
    if motion == "reduce":
        assert styles["lane"] == "0s" and styles["prefill"] == "0s"
        assert set(styles["newCells"]) == {"none"}
    else:
        assert styles["lane"] != "0s" and styles["prefill"] != "0s"
        assert set(styles["newCells"]) == {"wt-in"}
    assert console_errors == []


PLAY_EVERY_MS = 4000  # the walkthrough's auto-advance period (static/js/walkthrough/index.js)


def test_play_advances_and_pause_stops(page, fake_server, console_errors):
    page.clock.install()  # the page's timers run on a clock the test moves: no real seconds pass
    open_page(page, fake_server, WIDE)
    play = page.locator(".wt-play")
    play.click()
    expect(play).to_have_attribute("aria-pressed", "true")
    page.clock.run_for(PLAY_EVERY_MS)
    expect(page.locator(FIGURE)).to_have_attribute("data-stage", "template")
    play.click()
    expect(play).to_have_attribute("aria-pressed", "false")
    paused_at = page.locator(FIGURE).get_attribute("data-stage")
    page.clock.run_for(3 * PLAY_EVERY_MS)  # three periods: a timer left running would have moved on
    assert page.locator(FIGURE).get_attribute("data-stage") == paused_at
    assert console_errors == []


def test_lab_run_is_shown_and_a_bad_one_is_refused(page, fake_server, console_errors):
    open_page(page, fake_server, WIDE)
    # A run the lab exported after a cancel: the first five tokens, then `cancelled`.
    events = [e for e in TRACE["events"] if e["type"] != "token" or e["index"] < 5][:-1]
    events.append(
        {
            "type": "cancelled",
            "schema": 1,
            "request_id": "lab-1",
            "t_ms": events[-1]["t_ms"] + 1,
            "reason": "cancelled",
            "cause": "client",
            "state": "decode",
            "tokens": 5,
            "text": "".join(e["text"] for e in TOKENS[:5]),
            "metrics": {},
        }
    )
    lab_trace = {**TRACE, "events": events}
    page.evaluate("(t) => document.dispatchEvent(new CustomEvent('kvscope:replay-trace', {detail: t}))", lab_trace)
    figure = page.locator(FIGURE)
    expect(figure).to_have_attribute("data-source", "imported")
    expect(figure).to_have_attribute("data-stage", "map")
    state = snapshot(page)
    assert state["generatedCells"] == 5
    assert "incomplete" in state["end"]
    expect(page.locator(".wt-source-text")).to_have_text("Run from the lab")

    page.evaluate("() => document.dispatchEvent(new CustomEvent('kvscope:replay-trace', {detail: {format: 'nope'}}))")
    expect(page.locator(".wt-run-status")).to_contain_text("Could not show that run")
    expect(figure).to_have_attribute("data-source", "imported")  # the previous run stays
    page.locator(".wt-back").click()
    expect(figure).to_have_attribute("data-source", "recorded")
    assert console_errors == []


def test_without_its_trace_the_figure_says_it_is_schematic(page, fake_server):
    page.route("**/trace-example.json", lambda route: route.fulfill(status=500, body="broken"))
    page.set_viewport_size(WIDE)
    page.goto(fake_server.url + "/#stage-decode")
    figure = page.locator(FIGURE)
    expect(figure).to_have_attribute("data-source", "schematic")
    expect(page.locator(".wt-source-tag")).to_have_text("schematic")
    expect(page.locator(".wt-timeline-legend")).to_contain_text("no measured times")
    expect(page.locator(".wt-run-status")).to_contain_text("could not be loaded")
    assert page.locator(".wt-step .tag-measured").count() == 0, "no number claims to be measured"
    page.locator(".wt-next").click()
    expect(figure).to_have_attribute("data-stage", "cache")
    assert snapshot(page)["cacheColumns"] > 0


@pytest.mark.parametrize("viewport", [WIDE, NARROW], ids=["1440", "375"])
def test_live_run_plays_the_real_models_events(page, real_server, console_errors, viewport):
    frames: list[dict] = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda payload: frames.append(json.loads(payload))))
    page.set_viewport_size(viewport)
    page.goto(real_server.url + "/")
    figure = page.locator(FIGURE)
    run = page.locator(".wt-run")
    expect(run).to_be_enabled(timeout=30000)
    run.click()
    expect(figure).to_have_attribute("data-source", "live")
    expect(page.locator(".wt-end")).to_be_visible(timeout=240000)
    expect(page.locator(".wt-back")).to_be_visible()

    final = next(f for f in frames if f.get("type") in ("finished", "cancelled", "error"))
    events = [f for f in frames if f.get("request_id") == final["request_id"]]
    tokens = [e for e in events if e["type"] == "token"]
    assert final["type"] == "finished" and tokens
    state = snapshot(page)
    assert state["stage"] == "end"
    assert state["generatedCells"] == len(tokens) == state["answerTokens"]
    assert state["cacheColumns"] == tokens[-1]["cache_tokens"]
    assert state["panelText"].startswith(final["text"])
    assert final["reason"] in state["end"]
    expect(page.locator(".wt-source-text")).to_have_text("Live run")
    expect(page.locator(".wt-source-tag")).to_have_text("measured")

    legend = page.locator(".wt-timeline-legend")
    expect(legend).to_contain_text(f"decode {len(tokens) - 1} steps")
    expect(legend).to_contain_text(re.compile(r"prefill [\d.,]+ (ms|s)"))
    expect(legend.locator(".tag-measured")).to_be_visible()
    assert page.locator(".wt-seg.decode").count() == len(tokens) - 1
    screenshot(page, f"walkthrough-live-{viewport['width']}")
    assert console_errors == []
