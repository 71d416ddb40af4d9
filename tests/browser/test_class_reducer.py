"""The class view's pure feed reducer (static/js/class/feed-state.js) in Chromium on fixed event lists, no
server (the static files over HTTP): a request from submit to end, blocks, preemption, sharing and lost
events, a bounded history, and steps from before the page subscribed (`history`) filed as grid columns
only: no lane, block or count moves for them, a step the grid already has is not drawn twice, and the
grid's hint tells an engine that never stepped from an idle one's last steps."""

from __future__ import annotations

import pytest


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


PAST_STEPS = [
    # r1 ran and ended before the page opened (its end is not in the feed's history); r2 runs on
    {**step(7, [item("r1", "decode", [1]), item("r2", "prefill", [2, 3], 30)]), "history": True},
    {**step(8, [item("r1", "decode", [1]), item("r2", "decode", [2, 3])], preempted=["r9"]), "history": True},
]
SNAPSHOT = {"type": "engine_snapshot", "waiting": 0, "running": 1, "policy": {"batching": "continuous"}, "kv": KV}


def test_reducer_files_steps_from_before_the_page_as_grid_columns_only(reduce):
    got = reduce(
        [SNAPSHOT, *PAST_STEPS],
        """return { steps: s.steps.map((st) => [st.step, st.cells]), rows: fs.gridRows(s).map((r) => r.label),
          lanes: fs.lanes(s).length, blocks: s.blocks.size, kv: s.kv, running: s.running, last: s.lastStep.step };""",
    )
    assert got["steps"] == [[7, {"r1": "decode", "r2": "prefill"}], [8, {"r1": "decode", "r2": "decode"}]]
    assert got["rows"] == ["laptop 1", "laptop 2"] and got["last"] == 8
    # the snapshot is newer than any past step: its pool and counts stand, and no lane is guessed
    assert got["lanes"] == 0 and got["blocks"] == 0 and got["kv"] == KV and got["running"] == 1


def test_reducer_takes_up_a_past_request_when_the_live_feed_names_it(reduce):
    live = [step(9, [item("r2", "decode", [2, 3])]), *[step(n, []) for n in range(10, 10 + 48)]]
    lanes = "return fs.lanes(s).map((r) => [r.key, r.status]);"
    assert reduce([SNAPSHOT, *PAST_STEPS, live[0]], lanes) == [["r2", "decode"]]
    # r1 never reappears: once its steps leave the grid it is forgotten, as an ended request is
    rows = "return [fs.gridRows(s).map((r) => r.key), s.requests.has('r1'), s.steps.length];"
    assert reduce([SNAPSHOT, *PAST_STEPS, *live], rows) == [[], False, 48]


def test_reducer_skips_a_past_step_the_grid_already_has(reduce):
    steps = "return s.steps.map((st) => st.step);"
    again = [{**step(8, [item("r2", "decode", [2, 3])]), "history": True}]  # a resubscribe sends it again
    assert reduce([SNAPSHOT, *PAST_STEPS, step(9, [item("r2", "decode", [2, 3])]), *again], steps) == [7, 8, 9]


def test_the_grid_hint_tells_no_step_yet_from_an_idle_engines_last_steps(page, static_url):
    page.goto(static_url + "/static/js/class/feed-state.js")
    hints = page.evaluate(
        """async ([snapshot, past]) => {
          const fs = await import('/static/js/class/feed-state.js');
          const grid = await import('/static/js/class/batch-grid.js');
          return [grid.gridHint(fs.createClassState()), grid.gridHint(fs.reduceAll([{ ...snapshot, running: 0 }, ...past]))];
        }""",
        [SNAPSHOT, PAST_STEPS],
    )
    assert hints[0].startswith("No engine step yet")
    assert hints[1].startswith("The engine is idle since step 8: these are its last 2 steps")
