"""The class view (/class) and the students' side of class mode, in Chromium against the fake model:
the pure feed reducer on fixed event lists; 12 simulated students whose lanes, batch grid and block
map show up and whose counters agree with the server's; teacher controls refused without the key and
working with it; a static-batching flip seen in the next steps; follow-the-teacher; no prompt text on
the projector unless "show prompts" is on (and then a notice on the students' page); screenshots."""

from __future__ import annotations

import json
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


# ---- the pure reducer (no server: the static files over HTTP) ----------------------------------


@pytest.fixture
def reduce(page, static_url):
    """reduce(events, body) → runs `body` with `fs` (feed-state.js) and `s` (the state after events)."""
    page.goto(static_url + "/static/js/class/feed-state.js")

    def run(events, body):
        return page.evaluate(
            f"""async (events) => {{
              const fs = await import('/static/js/class/feed-state.js');
              const s = fs.reduceAll(events);
              {body}
            }}""",
            events,
        )

    return run


KV = {"total": 8, "used": 0, "cached": 0, "free": 8, "block_size": 16, "bytes_per_block": 4096}


def step(n, batch, waiting=0, preempted=(), used=None):
    held = used if used is not None else len({b for entry in batch for b in entry["blocks"]})
    kv = {**KV, "used": held, "free": KV["total"] - held}
    return {
        "type": "engine_step",
        "step": n,
        "ms": 10.0 + n,
        "batch_tokens": sum(b["tokens"] for b in batch),
        "batch": batch,
        "preempted": list(preempted),
        "kv": kv,
        "waiting": waiting,
        "running": len(batch),
    }


def item(rid, kind, blocks, tokens=1, shared=()):
    return {
        "request": rid,
        "label": f"laptop {rid[1:]}",
        "kind": kind,
        "tokens": tokens,
        "blocks": blocks,
        "shared_blocks": list(shared),
    }


LIFE = [
    {"type": "engine_snapshot", "waiting": 0, "running": 0, "policy": {"batching": "continuous"}, "kv": KV},
    {"type": "engine_submit", "request": "r1", "label": "laptop 1", "prompt_tokens": 20},
    {"type": "engine_submit", "request": "r2", "label": "laptop 2", "prompt_tokens": 30},
    {"type": "engine_admit", "request": "r1", "label": "laptop 1", "prompt_tokens": 20},
    step(1, [item("r1", "prefill", [3, 4], tokens=20)], waiting=1),
    step(2, [item("r1", "decode", [3, 4])], waiting=1),
    {"type": "engine_end", "request": "r1", "label": "laptop 1", "outcome": "finished", "reason": "eos", "tokens": 2},
    # the step that produced r1's last token is published after its end, with its blocks gone
    step(3, [item("r1", "decode", [])], waiting=1, used=0),
]


def test_reducer_follows_a_request_from_submit_to_end(reduce):
    got = reduce(
        LIFE,
        """return {
          lanes: fs.lanes(s).map((r) => [r.key, r.status, r.tokens]),
          grid: s.steps.map((st) => st.cells),
          blocks: [...s.blocks.keys()], kv: s.kv.used, ended: s.ended, last: s.lastStep,
          rows: fs.gridRows(s).map((r) => r.key) };""",
    )
    # in flight first, then the ended ones; r1's end is not undone by the step published after it
    assert got["lanes"] == [["r2", "waiting", 0], ["r1", "finished", 2]]
    assert got["grid"] == [
        {"r1": "prefill", "r2": "waiting"},
        {"r1": "decode", "r2": "waiting"},
        {"r1": "decode", "r2": "waiting"},
    ]
    assert got["blocks"] == [] and got["kv"] == 0
    assert got["ended"] == {"finished": 1, "cancelled": 0, "error": 0}
    assert got["last"]["batchSize"] == 1 and got["last"]["step"] == 3
    assert got["rows"] == ["r1", "r2"]
    # waiting/running: the newer of the last step's and the last class_stats' counts
    stats = {"type": "class_stats", "waiting": 0, "running": 0, "finished": 1}
    queue = "return [s.waiting, s.running];"
    assert reduce(LIFE, queue) == [1, 1]
    assert reduce([*LIFE, stats], queue) == [0, 0]
    assert reduce([*LIFE, stats, step(4, [item("r2", "prefill", [5], 30)])], queue) == [0, 1]
    # endings: the page's own count until class_stats comes, then the server's plus the feed's since
    end_r2 = {"type": "engine_end", "request": "r2", "outcome": "cancelled", "reason": "cancelled"}
    ends = "return fs.endings(s);"
    assert reduce(LIFE, ends) == {"finished": 1, "cancelled": 0, "error": 0}
    assert reduce([*LIFE, {**stats, "finished": 5, "cancelled": 2}, end_r2], ends) == {
        "finished": 5,
        "cancelled": 3,
        "error": 0,
    }


def test_reducer_blocks_preemption_sharing_and_drops(reduce):
    shared_step = step(
        1, [item("r1", "prefill", [0, 1], 20, shared=[0]), item("r2", "prefill", [0, 5], 20, shared=[0])]
    )
    admits = [
        {"type": "engine_admit", "request": r, "label": f"laptop {r[1:]}", "prompt_tokens": 20} for r in ("r1", "r2")
    ]
    owners = "return Object.fromEntries([...s.blocks].map(([id, b]) => [id, [b.owner, b.shared]]));"
    # a prefix block both hold: drawn in its first holder's colour and marked shared
    assert reduce([*admits, shared_step], owners) == {"0": ["r1", True], "1": ["r1", False], "5": ["r2", False]}
    # 3 blocks reserved; filled: 20 + 20 prompt positions, the shared block's 16 counted once
    assert reduce([*admits, shared_step], "return fs.kvBytes(s);") == {
        "used": 3 * 4096,
        "cached": 0,
        "pool": 8 * 4096,
        "perBlock": 4096,
        "filled": 24 * 4096 / 16,
    }
    events = [
        *admits,
        shared_step,
        {"type": "engine_preempt", "request": "r2", "label": "laptop 2", "blocks_freed": 2, "dropped": 3},
        step(2, [item("r1", "decode", [0, 1])], waiting=1),
        {"type": "class_state", "laptops": 12, "settings": {"show_prompts": False, "paused": True}},
        {"type": "class_stats", "finished": 4, "feed_dropped": 3},
    ]
    got = reduce(
        events,
        owners.replace("return ", "return { blocks: ").rstrip(";")
        + """, r2: s.requests.get('r2').status, cell: s.steps[1].cells.r2, dropped: s.dropped,
          laptops: s.laptops, paused: s.settings.paused, stats: s.stats.finished, bytes: fs.kvBytes(s) };""",
    )
    # r2 preempted: its own block 5 went back, block 0 is r1's alone again
    assert got["blocks"] == {"0": ["r1", False], "1": ["r1", False]}
    assert got["r2"] == "preempted" and got["cell"] == "preempted"
    assert got["dropped"] == 3 and got["laptops"] == 12 and got["paused"] is True and got["stats"] == 4
    # r1: 20 prompt positions and 1 decoded token in its 2 blocks
    assert got["bytes"] == {"used": 2 * 4096, "cached": 0, "pool": 8 * 4096, "perBlock": 4096, "filled": 21 * 256}
    # cancelled between steps (no step follows to recount the pool): its blocks count as free at once
    cancel = {"type": "engine_end", "request": "r1", "outcome": "cancelled", "reason": "cancelled", "blocks_freed": 2}
    assert reduce([*events, cancel], "return [s.kv.used, s.kv.free, s.blocks.size];") == [0, KV["total"], 0]


def test_reducer_clears_lanes_left_waiting_by_lost_events(reduce):
    submit = {"type": "engine_submit", "request": "r1", "label": "laptop 1", "prompt_tokens": 20}
    idle = {"type": "class_stats", "waiting": 0, "running": 0}
    live = "return fs.lanes(s).map((r) => r.key);"
    assert reduce([submit, idle], live) == ["r1"]  # nothing was lost: the engine's count is older
    # events were lost (r1's end among them, maybe) and the engine is idle: the lane goes
    lost = {"type": "engine_policy", "policy": {"batching": "continuous"}, "dropped": 4}
    assert reduce([submit, lost, idle], live) == []


def test_reducer_keeps_a_bounded_history(reduce):
    events = [step(n, [item(f"r{n}", "prefill", [n % 8])]) for n in range(1, 201)]
    events += [
        {"type": "engine_end", "request": f"r{n}", "label": "x", "outcome": "cancelled", "reason": "cancelled"}
        for n in range(1, 201)
    ]
    got = reduce(
        events, "return [s.steps.length, s.requests.size, fs.HISTORY_STEPS, fs.RECENT_ENDED, s.ended.cancelled];"
    )
    steps, kept, history, recent, cancelled = got
    assert steps == history
    # only what the grid (the last `history` steps) or the lanes' recent endings still show is kept
    assert kept == max(history, recent) and cancelled == 200


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
