"""The class view (/class) and the students' side of class mode, in Chromium against the fake model
(its pure reducer: test_class_reducer.py): 12 simulated students whose lanes, batch grid and block
map show up and whose counters agree with the server's; teacher controls refused without the key and
working with it; a static-batching flip seen in the next steps; batch-invariant mode switched by keyboard
(refused while prefix caching is on) and seen in /api/model; follow-the-teacher; no prompt text on
the projector unless "show prompts" is on (and then a notice on the students' page); screenshots."""

from __future__ import annotations

import json
import re
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kvscope_testkit import Client, screenshot, start_live_server, wait_until
from playwright.sync_api import expect

ROOT = Path(__file__).resolve().parents[2]
KEY = "class-test-key-7f3a"
CLASS_ENV = {"KVSCOPE_CLASS_MODE": "true", "KVSCOPE_TEACHER_KEY": KEY}
SLOW_STEPS = "fake:delay=40"  # 40 ms a step: requests stay in flight long enough to be seen

# Every frame the page's sockets receive, in order (an init script wraps WebSocket).
RECORD_FRAMES = """
(() => {
  const Native = window.WebSocket;
  window.__frames = [];
  window.WebSocket = class extends Native {
    constructor(...args) {
      super(...args);
      this.addEventListener('message', (m) => { window.__frames.push(m.data); });
    }
  };
})();
"""


@pytest.fixture
def ignored_console_errors():
    """Besides the favicon probe, the 403 and 400 answers the tests provoke on purpose (Chromium logs
    every 4xx fetch as a console error)."""
    return ("/favicon.ico", "status of 403", "status of 400")


@pytest.fixture
def class_server():
    """A fresh class-mode server per test, so its counters start at zero."""
    server = start_live_server(SLOW_STEPS, env=CLASS_ENV)
    yield server
    server.stop()


def post(server, path, body=None, key=None):
    """(status, JSON answer) of a POST with the page's own Origin, and the teacher key if given."""
    headers = {"Content-Type": "application/json", "Origin": server.url}
    if key:
        headers["X-Teacher-Key"] = key
    req = urllib.request.Request(server.url + path, data=json.dumps(body or {}).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def get_json(server, path):
    with urllib.request.urlopen(server.url + path, timeout=10) as r:
        return json.load(r)


def open_class(page, server, teacher=True):
    page.add_init_script(RECORD_FRAMES)
    page.goto(f"{server.url}/class" + (f"?key={KEY}" if teacher else ""))
    expect(page.locator('[data-class-figure="feed"][data-status="open"]')).to_be_attached(timeout=20_000)


def open_more_controls(page) -> None:
    """Unfold the teacher's detail controls (limits, batching, batch size), folded by default."""
    page.locator("[data-more-controls] > summary").click()
    expect(page.locator('[data-control="per_laptop_cap"]')).to_be_visible()


def counter(page, name) -> str:
    return page.locator(f'[data-counter="{name}"]').inner_text()


def lane_count(page) -> int:
    return page.locator(".cv-lane").count()


def subscribed_stats(server, predicate, timeout=30.0) -> dict:
    """The first class_stats an independent feed subscriber gets that satisfies `predicate`."""
    watcher = Client(server)
    try:
        watcher.send({"type": "subscribe"})
        found = watcher.wait(None, lambda evs: any(e["type"] == "class_stats" and predicate(e) for e in evs), timeout)
        return next(e for e in reversed(found) if e["type"] == "class_stats" and predicate(e))
    finally:
        watcher.close()


def students(server, n, **fields):
    """n student sockets, each with one request in flight; returns (clients, request ids)."""
    clients = [Client(server) for _ in range(n)]
    rids = []
    for i, c in enumerate(clients):
        rid = f"s{i}"
        c.generate(rid, **fields)
        rids.append(rid)
    return clients, rids


def finish(clients, rids):
    ends = [c.wait(rid, timeout=120)[-1] for c, rid in zip(clients, rids)]  # two busy cores: be generous
    for c in clients:
        c.close()
    return ends


# ---- the class view against a server -----------------------------------------------------------


def test_twelve_students_fill_the_view_and_counters_agree(page, class_server, console_errors):
    from bench.class_sim import run_class_sim

    open_class(page, class_server)
    result = {}
    sim = threading.Thread(
        target=lambda: result.setdefault(
            "summary",
            run_class_sim(
                class_server.url,
                students=12,
                minutes=0.15,
                seed=3,
                short=True,
                think_s=0.3,
                join_s=0.5,
                cancel_rate=0.1,
                projector=False,
            ),
        ),
        daemon=True,
    )
    sim.start()
    # while the class works: every laptop counted, lanes for requests in flight, steps and blocks moving
    expect(page.locator("[data-laptops]")).to_have_text("12", timeout=20_000)
    wait_until(
        lambda: int(page.locator('[data-class-figure="lanes"]').get_attribute("data-in-flight") or 0) >= 4,
        "several requests in flight on the lanes",
    )
    wait_until(
        lambda: int(page.locator('[data-class-figure="block-map"]').get_attribute("data-used") or 0) > 0,
        "KV blocks held on the block map",
    )
    first = int(page.locator('[data-class-figure="batch-grid"]').get_attribute("data-step") or 0)
    wait_until(
        lambda: int(page.locator('[data-class-figure="batch-grid"]').get_attribute("data-step") or 0) > first + 5,
        "the batch grid moving on",
    )
    labels = page.locator(".cv-lane-label").all_inner_texts()
    assert labels and all(label.startswith("laptop ") for label in labels)
    screenshot(page, "class-view-1280x720")
    page.set_viewport_size({"width": 1920, "height": 1080})
    screenshot(page, "class-view-1920x1080")
    sim.join(120)
    summary = result["summary"]
    assert summary.ok and summary.requests >= 12

    # after the class: the page's counters are the server's (an independent subscriber's class_stats)
    # and the students' own count of how their requests ended
    stats = subscribed_stats(class_server, lambda e: e["running"] == 0 and e["waiting"] == 0)
    assert (stats["finished"], stats["cancelled"]) == (summary.finished, summary.cancelled)
    expect(page.locator('[data-counter="finished"]')).to_have_text(str(stats["finished"]), timeout=10_000)
    expect(page.locator('[data-counter="cancelled"]')).to_have_text(str(stats["cancelled"]))
    expect(page.locator('[data-counter="running"]')).to_have_text("0")
    expect(page.locator('[data-counter="waiting"]')).to_have_text("0")
    assert counter(page, "ttft_p50") not in ("", "–") and counter(page, "tokens_per_s") != ""
    assert console_errors == []


def test_teacher_controls_need_the_key(page, class_server, console_errors):
    for path, body in [
        ("/api/class/settings", {"paused": True}),
        ("/api/class/policy", {"batching": "static"}),
        ("/api/class/cancel-all", {}),
        ("/api/class/stage", {"stage": "decode"}),
    ]:
        status, answer = post(class_server, path, body)
        assert status == 403 and answer["error"]["code"] == "teacher_only", (path, answer)
    assert get_json(class_server, "/api/class")["settings"]["paused"] is False
    # a student opening /class sees the view but no controls
    open_class(page, class_server, teacher=False)
    assert page.locator('[data-class-figure="controls"]').count() == 0
    assert page.locator("body").get_attribute("data-teacher") == "false"
    assert console_errors == []


def test_a_teacher_on_their_own_loopback_server_needs_no_key(page, fake_server, console_errors):
    """Without --class, a loopback server's /class is the teacher's: controls shown, the feed followed,
    and the students' page shows nothing of class mode."""
    open_class(page, fake_server, teacher=False)
    assert page.locator("body").get_attribute("data-class-mode") == "false"
    expect(page.locator('[data-control="pause"]')).to_be_visible()
    expect(page.locator("[data-policy]")).to_contain_text("continuous batching", timeout=10_000)
    page.goto(f"{fake_server.url}/")
    expect(page.locator('#model-status[data-status="ready"]')).to_be_attached(timeout=30_000)
    expect(page.locator('[data-figure="class-follow"]')).to_be_hidden()
    assert console_errors == []


def test_teacher_pauses_resumes_and_cancels_everything(page, class_server, console_errors):
    open_class(page, class_server)
    pause = page.locator('[data-control="pause"]')
    pause.click()
    expect(pause).to_have_attribute("aria-pressed", "true")
    assert get_json(class_server, "/api/class")["settings"]["paused"] is True
    clients, rids = students(class_server, 3, max_new_tokens=400)
    # paused: queued, never admitted
    wait_until(lambda: page.locator('.cv-lane[data-status="waiting"]').count() == 3, "three waiting lanes")
    expect(page.locator(".cv-lane-status", has_text="paused by the teacher")).to_have_count(3)
    pause.click()
    expect(pause).to_have_attribute("aria-pressed", "false")
    wait_until(lambda: page.locator('.cv-lane[data-status="decode"]').count() == 3, "three decoding lanes")
    page.locator('[data-control="cancel-all"]').click()
    ends = finish(clients, rids)
    assert [e["type"] for e in ends] == ["cancelled"] * 3
    expect(page.locator('[data-counter="cancelled"]')).to_have_text("3", timeout=10_000)
    expect(page.locator("[data-control-status]")).to_contain_text("cancelled")
    # a bad limit (folded under "More controls"): the server's message, naming the field, shows in the status line
    open_more_controls(page)
    page.fill('[data-control="per_laptop_cap"]', "99")
    page.click('form[data-form="limits"] button[type="submit"]')
    expect(page.locator('[data-control-status][data-ok="false"]')).to_contain_text("per_laptop_cap")
    page.locator('[data-class-figure="controls"]').scroll_into_view_if_needed()
    screenshot(page, "class-teacher-controls-1280x720")
    assert console_errors == []


def test_a_class_view_opened_after_the_steps_ran_shows_them(page, class_server, console_errors):
    clients, rids = students(class_server, 3, max_new_tokens=6)
    finish(clients, rids)
    wait_until(lambda: get_json(class_server, "/api/engine")["running"] == 0, "the engine idle")
    last = get_json(class_server, "/api/engine")["steps"]
    open_class(page, class_server)  # nobody followed the feed while they ran
    grid = page.locator('[data-class-figure="batch-grid"]')
    expect(grid).to_have_attribute("data-step", str(last), timeout=10_000)
    expect(grid.locator("[data-grid-hint]")).to_contain_text(f"idle since step {last}")
    state = page.evaluate(
        """async () => { const m = await import('/static/js/class/feed.js'); const s = m.classState();
             const fs = await import('/static/js/class/feed-state.js');
             return { steps: s.steps.length, rows: fs.gridRows(s).length, lanes: fs.lanes(s).length }; }"""
    )
    assert state["rows"] == 3 and 6 <= state["steps"] <= 48 and state["lanes"] == 0  # ended unseen: no lane
    # The empty lanes do not claim there was no request: the counters show the three that ended.
    expect(page.locator("[data-lanes-empty]")).to_have_text(
        "No request since this view opened (the counters include earlier ones).", timeout=10_000
    )
    expect(grid.locator("canvas")).to_have_attribute(
        "aria-label", re.compile(r"the last \d+ engine steps for 3 requests")
    )
    screenshot(page, "class-view-opened-late-1280x720")
    page.set_viewport_size({"width": 1920, "height": 1080})
    screenshot(page, "class-view-opened-late-1920x1080")
    assert console_errors == []


def test_static_batching_shows_in_the_next_steps(page, class_server, console_errors):
    open_class(page, class_server)
    open_more_controls(page)
    page.select_option('[data-control="batching"]', "static")
    expect(page.locator("[data-policy]")).to_contain_text("static batching", timeout=10_000)
    assert get_json(class_server, "/api/class")["policy"]["batching"] == "static"
    # the first two are admitted together: queued while admissions are paused, then resumed
    pause = page.locator('[data-control="pause"]')
    pause.click()
    expect(pause).to_have_attribute("aria-pressed", "true")
    first, first_ids = students(class_server, 2, max_new_tokens=60)
    wait_until(lambda: page.locator('.cv-lane[data-status="waiting"]').count() == 2, "the first two queued")
    pause.click()
    wait_until(lambda: page.locator('.cv-lane[data-status="decode"]').count() == 2, "the first batch decoding")
    late, late_ids = students(class_server, 2, max_new_tokens=5)
    finish(first, first_ids)
    finish(late, late_ids)
    # the grid's kept steps: while the first batch decoded, the late requests only waited
    cells = page.evaluate(
        """async () => { const m = await import('/static/js/class/feed.js');
             return m.classState().steps.map((st) => st.cells); }"""
    )
    keys = sorted({k for c in cells for k in c})
    assert len(keys) == 4, keys
    mixed = [c for c in cells if any(v == "decode" for v in c.values()) and any(v == "prefill" for v in c.values())]
    assert mixed == [], "static batching admitted a request into a running batch"
    assert any("waiting" in c.values() and "decode" in c.values() for c in cells)
    assert console_errors == []


def test_prefix_caching_shows_shared_blocks(page, class_server, console_errors):
    open_class(page, class_server)
    page.locator('[data-control="prefix_caching"]').check()
    expect(page.locator("[data-policy]")).to_contain_text("prefix caching on", timeout=10_000)
    same = [{"role": "user", "content": "Explain the KV cache, block by block. " * 4}]
    first, first_ids = students(class_server, 1, messages=same, max_new_tokens=80)
    wait_until(lambda: page.locator('.cv-lane[data-status="decode"]').count() == 1, "the first one decoding")
    second, second_ids = students(class_server, 1, messages=same, max_new_tokens=80)
    # the second prompt's full blocks are the first one's: the block map marks them shared
    wait_until(lambda: int(page.locator("[data-kv-shared]").inner_text()) > 0, "shared prefix blocks on the map")
    for c, rid in zip(first + second, first_ids + second_ids):
        c.cancel(rid)
    finish(first + second, first_ids + second_ids)
    assert console_errors == []


def test_the_teacher_switches_batch_invariant_mode_by_keyboard(page, class_server, console_errors):
    assert post(class_server, "/api/class/policy", {"prefix_caching": True}, key=KEY)[0] == 200
    open_class(page, class_server)
    toggle = page.locator('[data-control="batch_invariant"]')
    reason = page.locator("[data-mode-reason]")
    line = page.locator('[data-class-figure="mode"]')
    more = page.locator("[data-more-controls] > summary")
    more.focus()
    page.keyboard.press("Enter")  # the toggle is under "More controls", with the other batching policies
    # prefix caching on: the toggle waits, saying why; the room's line is hidden while the mode is off
    expect(toggle).to_be_disabled(timeout=10_000)
    expect(reason).to_contain_text("Turn prefix caching off first")
    expect(line).to_be_hidden()
    page.locator('[data-control="prefix_caching"]').focus()
    page.keyboard.press("Space")
    expect(toggle).to_be_enabled(timeout=10_000)
    expect(reason).to_have_text("")
    toggle.focus()
    page.keyboard.press("Space")
    expect(toggle).to_have_attribute("aria-pressed", "true", timeout=10_000)
    assert page.evaluate("document.activeElement.dataset.control") == "batch_invariant"  # focus kept
    assert get_json(class_server, "/api/model")["batch_invariant"]["on"] is True
    expect(line).to_contain_text("The teacher turned batch-invariant mode on")
    expect(page.locator("[data-control-status]")).to_have_text("Batch-invariant mode on.")
    clients, rids = students(class_server, 2, max_new_tokens=100)
    wait_until(lambda: lane_count(page) == 2, "two lanes in the mode")
    # the first steps in the mode: the page asks again for what the engine's kernel check found
    expect(line).to_contain_text("each answer is the one it would get alone", timeout=10_000)
    expect(line).to_contain_text("prompts prefilled alone")
    for size, name in (((1280, 720), "1280x720"), ((1920, 1080), "1920x1080"), ((375, 740), "375")):
        page.set_viewport_size({"width": size[0], "height": size[1]})
        page.locator('[data-class-figure="controls"]').scroll_into_view_if_needed()
        screenshot(page, f"class-batch-invariant-{name}")
    finish(clients, rids)
    # in the mode the engine refuses prefix caching: the box goes back, the status line says why
    page.set_viewport_size({"width": 1280, "height": 720})
    prefix = page.locator('[data-control="prefix_caching"]')
    prefix.focus()
    page.keyboard.press("Space")
    expect(page.locator('[data-control-status][data-ok="false"]')).to_contain_text(
        "batch-invariant mode keeps prefix caching off"
    )
    expect(prefix).not_to_be_checked()
    # a reload shows the mode from /api/class, as the engine reports it, without claiming a switch
    page.reload()
    expect(toggle).to_have_attribute("aria-pressed", "true", timeout=20_000)
    more.focus()
    page.keyboard.press("Enter")
    expect(line).to_contain_text("Batch-invariant mode is on: decode steps padded to")
    toggle.focus()
    page.keyboard.press("Enter")
    expect(toggle).to_have_attribute("aria-pressed", "false", timeout=10_000)
    assert get_json(class_server, "/api/model")["batch_invariant"] == {"on": False}
    expect(line).to_contain_text("The teacher turned batch-invariant mode off")
    assert console_errors == []


def test_follow_mode_moves_a_students_walkthrough(page, browser, class_server, console_errors):
    teacher = page
    teacher.goto(f"{class_server.url}/class?key={KEY}")  # sets the teacher cookie
    teacher.goto(f"{class_server.url}/")
    expect(teacher.locator('[data-figure="class-follow"]')).to_contain_text("You are the teacher")
    student_ctx = browser.new_context()
    try:
        student = student_ctx.new_page()
        student.goto(f"{class_server.url}/")
        follow = student.locator("[data-class-follow]")
        expect(follow).to_be_visible()
        follow.check()
        teacher.locator('.wt-stage-list button[data-stage="cache"]').click()
        expect(student.locator('.wt-stage-list button[data-stage="cache"]')).to_have_attribute(
            "aria-current", "step", timeout=10_000
        )
        assert get_json(class_server, "/api/class")["settings"]["follow_stage"] == "cache"
        # a student who stops following is left alone; following again goes to the teacher's stage now
        follow.uncheck()  # (Playwright scrolls the box into view: the student's own stage moves with it)
        teacher.locator('.wt-stage-list button[data-stage="tokens"]').click()
        wait_until(lambda: get_json(class_server, "/api/class")["settings"]["follow_stage"] == "tokens", "stage sent")
        tokens_button = student.locator('.wt-stage-list button[data-stage="tokens"]')
        assert tokens_button.get_attribute("aria-current") is None
        follow.check()
        expect(tokens_button).to_have_attribute("aria-current", "step", timeout=10_000)
    finally:
        student_ctx.close()
    assert console_errors == []


def test_prompts_reach_the_projector_only_when_shown(page, browser, class_server, console_errors):
    hidden_text, shown_text = "zebra-quartz-1", "walrus-tango-2"
    student_ctx = browser.new_context(viewport={"width": 375, "height": 740})
    try:
        student = student_ctx.new_page()
        student.goto(f"{class_server.url}/")
        notice = student.locator("[data-class-notice]")
        expect(student.locator("[data-class-follow]")).to_be_visible()
        expect(notice).to_be_hidden()

        open_class(page, class_server)
        c = Client(class_server)
        c.run("p1", messages=[{"role": "user", "content": hidden_text}], max_new_tokens=4)
        expect(page.locator('[data-counter="finished"]')).to_have_text("1", timeout=10_000)
        assert hidden_text not in page.locator("body").inner_text()
        assert not any(hidden_text in f for f in page.evaluate("window.__frames"))

        page.locator('[data-control="show_prompts"]').check()
        expect(notice).to_be_visible(timeout=10_000)
        expect(notice).to_contain_text("show prompts")
        screenshot(student, "class-student-notice-375")
        c.run("p2", messages=[{"role": "user", "content": shown_text}], max_new_tokens=4)
        expect(page.locator(".cv-lane-text", has_text=shown_text)).to_have_count(1, timeout=10_000)
        assert hidden_text not in page.locator("body").inner_text()
        c.close()
    finally:
        student_ctx.close()
    assert console_errors == []
