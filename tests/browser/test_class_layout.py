"""The projector view fits one screen: at 1280×720 and 1920×1080 every panel's box (join,
lanes, batch grid, block map, counters, the teacher's bar) lies inside the viewport with nothing to
scroll, the main controls (pause, cancel all, show prompts, the two policies) in view and the detail
controls folded; at 375 px the page is one scrolling column with nothing cut off at the side. The batch
grid keeps its last steps when the engine goes idle and says so. The server is `serve --class`, so the
controls also show the class's default policy (chunked prefill and prefix caching on)."""

from __future__ import annotations

import pytest
from kvscope_testkit import Client, screenshot, start_live_server, wait_until
from playwright.sync_api import expect

KEY = "class-layout-key-4Rt9"
PANELS = ("join", "counters", "lanes", "batch-grid", "block-map", "controls")
MAIN_CONTROLS = ("pause", "cancel-all", "show_prompts", "chunked_prefill", "prefix_caching")
DETAIL_CONTROLS = ("per_laptop_cap", "rate_per_min", "batching", "max_num_seqs")
PROJECTORS = ({"width": 1280, "height": 720}, {"width": 1920, "height": 1080})

# Each panel's box and the page's scroll size, as the browser lays them out.
BOXES = """() => ({
  page: [document.documentElement.scrollWidth, document.documentElement.scrollHeight],
  view: [innerWidth, innerHeight],
  panels: Object.fromEntries([...document.querySelectorAll('[data-class-figure]')].map((el) => {
    const r = el.getBoundingClientRect();
    return [el.dataset.classFigure, [r.left, r.top, r.right, r.bottom]];
  })),
})"""


@pytest.fixture(scope="module")
def class_server():
    server = start_live_server("fake:delay=40", env={"KVSCOPE_TEACHER_KEY": KEY}, args=["--class"])
    yield server
    server.stop()


def open_teacher_view(page, server, size) -> None:
    page.set_viewport_size(size)
    page.goto(f"{server.url}/class?key={KEY}")
    expect(page.locator('[data-class-figure="feed"][data-status="open"]')).to_be_attached(timeout=20_000)


def outside(page) -> list[str]:
    """The panels (and the page itself) that reach past the viewport: [] when one screen holds all."""
    boxes = page.evaluate(BOXES)
    width, height = boxes["view"]
    bad = [name for name in PANELS if name not in boxes["panels"]]
    for name, (left, top, right, bottom) in boxes["panels"].items():
        if left < 0 or top < 0 or right > width + 0.5 or bottom > height + 0.5:
            bad.append(f"{name} {[round(v) for v in (left, top, right, bottom)]} in {width}x{height}")
    if boxes["page"][0] > width or boxes["page"][1] > height:
        bad.append(f"the page scrolls: {boxes['page']} in {width}x{height}")
    return bad


def students_working(server, n=6):
    """n sockets, each with a long answer in flight, so the lanes, the grid and the block map fill."""
    clients = [Client(server) for _ in range(n)]
    for i, c in enumerate(clients):
        c.generate(f"fit{i}", max_new_tokens=200)
    return clients


def stop(clients):
    for i, c in enumerate(clients):
        c.cancel(f"fit{i}")
        c.wait(f"fit{i}", timeout=120)
        c.close()


@pytest.mark.parametrize("size", PROJECTORS, ids=lambda s: f"{s['width']}x{s['height']}")
def test_every_panel_fits_the_projector_screen_without_scrolling(page, class_server, console_errors, size):
    open_teacher_view(page, class_server, size)
    clients = students_working(class_server)
    try:
        wait_until(
            lambda: int(page.locator('[data-class-figure="lanes"]').get_attribute("data-in-flight") or 0) >= 6,
            "six lanes in flight",
        )
        grid = page.locator('[data-class-figure="batch-grid"]')
        wait_until(lambda: int(grid.get_attribute("data-step") or 0) >= 3, "the batch grid drawing steps")
        assert outside(page) == []
        for control in MAIN_CONTROLS:
            expect(page.locator(f'[data-control="{control}"]')).to_be_in_viewport()
        for control in DETAIL_CONTROLS:  # folded under "More controls"
            expect(page.locator(f'[data-control="{control}"]')).to_be_hidden()
        screenshot(page, f"class-fit-{size['width']}x{size['height']}")
        # unfolded, the detail controls open over the figures: still nothing to scroll
        page.locator("[data-more-controls] > summary").click()
        for control in DETAIL_CONTROLS:
            expect(page.locator(f'[data-control="{control}"]')).to_be_in_viewport()
        assert outside(page) == []
    finally:
        stop(clients)
    assert console_errors == []


def test_the_controls_show_the_class_default_policy(page, class_server, console_errors):
    open_teacher_view(page, class_server, PROJECTORS[0])
    expect(page.locator('[data-control="chunked_prefill"]')).to_be_checked(timeout=10_000)
    expect(page.locator('[data-control="prefix_caching"]')).to_be_checked()
    expect(page.locator("[data-policy]")).to_contain_text("chunked prefill (64)")
    assert console_errors == []


def test_the_batch_grid_keeps_its_last_steps_when_idle_with_a_hint(page, class_server, console_errors):
    open_teacher_view(page, class_server, PROJECTORS[0])
    hint = page.locator("[data-grid-hint]")
    grid = page.locator('[data-class-figure="batch-grid"]')
    expect(hint).to_be_visible(timeout=10_000)  # no step yet, or the earlier tests' last steps (the feed keeps them)
    before = int(grid.get_attribute("data-step") or 0)
    c = Client(class_server)
    try:
        c.run("idle1", max_new_tokens=6)
    finally:
        c.close()
    expect(hint).to_contain_text("idle since step", timeout=10_000)  # after class_stats says nothing runs
    steps = page.evaluate(
        "async () => (await import('/static/js/class/feed.js')).classState().steps.filter((s) => s.batchSize).length"
    )
    assert steps >= 6  # the request's prefill and decodes are still drawn
    assert int(grid.get_attribute("data-step")) > before
    screenshot(page, "class-idle-grid-1280x720")
    assert console_errors == []


def test_a_phone_gets_one_scrolling_column_with_nothing_cut_off(page, class_server, console_errors):
    open_teacher_view(page, class_server, {"width": 375, "height": 740})
    boxes = page.evaluate(BOXES)
    assert boxes["page"][0] <= 375, boxes["page"]
    assert all(right <= 375.5 and left >= 0 for left, _, right, _ in boxes["panels"].values()), boxes["panels"]
    expect(page.locator('[data-control="pause"]')).to_be_visible()
    page.locator('[data-class-figure="block-map"]').scroll_into_view_if_needed()
    expect(page.locator('[data-class-figure="block-map"] canvas')).to_be_in_viewport()
    screenshot(page, "class-phone-375")
    assert console_errors == []


# Whether the lanes drawn and the "+N more not shown" count add up to `n` requests.
EVERY_REQUEST_COUNTED = """(n) => {
  const more = document.querySelector('[data-lanes-more]');
  const hidden = parseInt((more ? more.textContent : '').trim().split(/\\s+/)[0].replace('+', ''), 10) || 0;
  return document.querySelectorAll('.cv-lane').length + hidden === n;
}"""


def test_lanes_that_do_not_fit_are_counted_not_cut(page, class_server, console_errors):
    open_teacher_view(page, class_server, PROJECTORS[0])
    page.locator('[data-control="pause"]').click()  # every request waits: lanes only, no answer ends them
    expect(page.locator('[data-control="pause"]')).to_have_attribute("aria-pressed", "true")
    clients = [Client(class_server) for _ in range(20)]
    try:
        for i, c in enumerate(clients):
            c.generate(f"many{i}", max_new_tokens=4)
        expect(page.locator("[data-lanes-more]")).to_contain_text("more not shown", timeout=10_000)
        page.wait_for_function(EVERY_REQUEST_COUNTED, arg=len(clients), timeout=10_000)  # the last may still come
        assert outside(page) == []
        rows = page.locator(".cv-lane").count()
        more = int(page.locator("[data-lanes-more]").inner_text().split()[0].lstrip("+"))
        assert rows + more == 20 and rows >= 3
    finally:
        page.locator('[data-control="pause"]').click()
        for i, c in enumerate(clients):
            c.wait(f"many{i}", timeout=120)
            c.close()
    assert console_errors == []
