"""Every number the page shows says where it comes from. The walk reads every visible text node that
holds a digit in the walkthrough, the calculator and the lab (after a fake-model run) and fails on one
that is not inside an element carrying a provenance: a `.tag` label, or `[data-provenance]` set to
measured / computed / cited / schematic / hypothetical on an element below the section. Also the
fact-check's corrections: the sentences that were wrong stay right."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvscope_testkit import screenshot
from playwright.sync_api import expect
from walkthrough_page import STAGES

ROOT = Path(__file__).resolve().parents[2]
TRACE = json.loads((ROOT / "static/data/trace-example.json").read_text(encoding="utf-8"))
NARROW, WIDE = {"width": 375, "height": 740}, {"width": 1440, "height": 900}
KINDS = ["measured", "computed", "cited", "schematic", "hypothetical"]

# The explicit allow-list: digits that are structure, not figures the page claims.
STRUCTURAL = [
    ".wt-stage-list",  # stage buttons "1 Input" … "11 Map"
    ".wt-stage-num",  # "5/11" in the figure's title
    ".kvc-slider-ends",  # a slider's two ends, the input's own limits
    "label > span:first-child",  # a control's name with its allowed range, e.g. "Max new tokens (1–1024)"
    "option",  # choices in a select, e.g. "bf16 / fp16"
    "[data-setting]",  # an experiment's own request settings ("each answered for 8 tokens"): inputs, not findings
    "code",  # command-line text such as --max-num-seqs 1
    ".lab-def",  # a metric's definition: the constants of its formula, e.g. (E2E − TTFT) ÷ (tokens − 1)
    ".visually-hidden",
]

# Walks one section; returns the offending text nodes as "text ← path".
WALK = """([rootSel, structural, kinds]) => {
  const root = document.querySelector(rootSel);
  const bad = [];
  // A name that starts with a letter (SmolLM2-135M, fp16, A100, Q4_1, arXiv:2309.06180) is not a number;
  // a heading's own numbering ("6 · History") is structure.
  const NAME = /[A-Za-z][\\w.:-]*\\d[\\w.:-]*/g;
  const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    const text = n.nodeValue.replace(/^\\s*\\d+\\s*·\\s/, '').replace(NAME, '');
    if (!/\\d/.test(text) || !el) continue;
    if (!el.checkVisibility({ checkOpacity: false, checkVisibilityCSS: true })) continue;
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    if (structural.some((s) => el.closest(s))) continue;
    const tagged = el.closest('.tag');
    const prov = el.closest('[data-provenance]');
    if (tagged && root.contains(tagged)) continue;
    if (prov && prov !== root && root.contains(prov) && kinds.includes(prov.dataset.provenance)) continue;
    const path = [];
    for (let e = el; e && e !== root; e = e.parentElement) {
      path.push(e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + (e.classList.length ? '.' + [...e.classList].join('.') : ''));
      if (path.length > 4) break;
    }
    bad.push(`${n.nodeValue.trim().slice(0, 80)}  ←  ${path.join(' < ')}`);
  }
  return bad;
}"""


def unlabelled(page, section: str) -> list[str]:
    return page.evaluate(WALK, [section, STRUCTURAL, KINDS])


def open_page(page, server, viewport):
    page.set_viewport_size(viewport)
    page.goto(server.url + "/")
    expect(page.locator(".wt-figure")).to_have_attribute("data-source", "recorded")
    expect(page.locator('#calculator [data-out="body"]')).to_be_visible(timeout=30_000)


@pytest.mark.parametrize("viewport", [NARROW, WIDE], ids=["375", "1440"])
def test_every_number_in_the_walkthrough_is_labelled(page, fake_server, console_errors, viewport):
    open_page(page, fake_server, viewport)
    for stage in STAGES:
        page.locator(f'.wt-stage-list button[data-stage="{stage}"]').click()
        expect(page.locator(".wt-figure")).to_have_attribute("data-stage", stage)
        bad = unlabelled(page, "#walkthrough")
        assert bad == [], f"stage {stage}:\n" + "\n".join(bad)
    overflow = page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0  # long cited tags wrap instead of widening the page
    for stage in ("cache", "delivery"):
        page.locator(f"#stage-{stage}").scroll_into_view_if_needed()
        page.locator(f'.wt-stage-list button[data-stage="{stage}"]').click()
        screenshot(page, f"provenance-walkthrough-{stage}-{viewport['width']}")
    assert console_errors == []


def test_every_number_in_the_calculator_is_labelled(page, fake_server, console_errors):
    open_page(page, fake_server, WIDE)
    calc = page.locator("#calculator")
    for preset in page.locator("#kvc-preset option").evaluate_all("(os) => os.map((o) => o.value)"):
        page.select_option("#kvc-preset", preset)
        bad = unlabelled(page, "#calculator")
        assert bad == [], f"preset {preset}:\n" + "\n".join(bad)
    calc.scroll_into_view_if_needed()
    screenshot(page, "provenance-calculator-1440")
    assert console_errors == []


def test_every_number_in_the_lab_is_labelled_after_a_run(page, fake_server, console_errors):
    open_page(page, fake_server, WIDE)
    expect(page.locator('#model-status[data-status="ready"]')).to_be_attached(timeout=120_000)
    expect(page.locator("#lab-prompt-tokens .ptok").first).to_be_attached(timeout=60_000)
    page.fill("#lab-max-new", "12")
    page.click("#lab-run")
    expect(page.locator('#lab-status[data-status="finished"]')).to_be_attached(timeout=120_000)
    bad = unlabelled(page, "#lab")
    assert bad == [], "\n".join(bad)
    page.locator("#lab-run-view").scroll_into_view_if_needed()
    screenshot(page, "provenance-lab-1440")
    assert console_errors == []


# ---- the fact-check's corrections ---------------------------------------------------------------


def step_text(page, stage: str) -> str:
    return page.locator(f"#stage-{stage}").inner_text()


def test_cache_lives_for_one_request_in_calculator_and_walkthrough(page, fake_server):
    open_page(page, fake_server, WIDE)
    intro = page.locator(".kvc-intro").inner_text()
    assert "as long as the conversation" not in intro
    assert "request" in intro and "prefill" in intro
    assert "while the request lives" in step_text(page, "map")


def test_delivery_first_token_comes_out_of_prefill_not_an_extra_step(page, fake_server):
    open_page(page, fake_server, WIDE)
    text = step_text(page, "delivery")
    assert "0.84" not in text
    # 0.8 s prefill, then 179 further tokens at 25 per second: the last lands at 0.8 + 7.16 ≈ 8 s.
    assert "0.8 s plus the time to" in text and "179" in text
    assert page.locator("#stage-delivery .tag-hypothetical").count() == 1


def note_of(page, stage: str, source: str) -> str:
    """The text of the note that a marker in the stage points at, found by the source's words."""
    for href in page.locator(f"#stage-{stage} a.note-ref").evaluate_all(
        "(as) => as.map((a) => a.getAttribute('href'))"
    ):
        text = page.locator(href).inner_text()
        if source in text:
            return text
    raise AssertionError(f"no note of stage {stage} names {source!r}")


def test_opt13b_figures_are_in_binary_units_with_their_source(page, fake_server):
    open_page(page, fake_server, WIDE)
    text = step_text(page, "cache")
    golden = json.loads((ROOT / "static/data/kv_golden.json").read_text(encoding="utf-8"))
    opt = next(p for p in golden["presets"] if p["id"] == "opt-13b")
    per_token = opt["bytes_per_token"]
    assert f"{per_token:,} B = {per_token // 1024} KiB" in text
    assert per_token * 2048 / 2**30 == 1.5625
    assert "1.56 GiB for one 2,048-token" in text and "1.5625 GiB" in text
    # The source's "800 KB" and "1.6 GB" are these binary amounts rounded, not decimal units.
    assert "rounded to decimal" not in text and "800 KB per" not in text and "1.6 GB for" not in text
    note = note_of(page, "cache", "Kwon et al. 2023")
    assert "arxiv.org/abs/2309.06180" in page.locator("#walkthrough .notes").inner_html()
    assert "PagedAttention" in note and "PagedAttention" not in text  # the title lives in the note


def test_cited_figures_are_numbered_notes_with_author_year_and_link(page, fake_server):
    open_page(page, fake_server, WIDE)
    for stage, who, link, title in [
        ("prefill", "Zhong et al. 2024", "https://arxiv.org/abs/2401.09670", "DistServe"),
        ("decode", "Agrawal et al. 2024", "https://arxiv.org/abs/2403.02310", "Sarathi-Serve"),
    ]:
        text = step_text(page, stage)
        assert who not in text and title not in text, "reading a stage no longer means reading a paper title"
        note = note_of(page, stage, who)
        assert title in note
        assert page.locator(f'#walkthrough .notes-list li a[href="{link}"]').count() == 1
    # The caveat the reference text gives: compute-bound only once the prompt fills the chip.
    assert "long enough to fill" in step_text(page, "prefill")


def test_legend_does_not_call_the_recorded_run_live(page, fake_server):
    open_page(page, fake_server, WIDE)
    legend = page.locator(".legend-provenance")
    for kind in KINDS:
        assert legend.locator(f"summary .tag-{kind}").count() == 1, kind
    legend.locator("summary").click()
    text = legend.inner_text()
    assert "measured live" not in text
    assert "recorded run" in text
    for kind in KINDS:
        assert legend.locator("dt", has_text=kind).count() == 1, kind


def test_story_prose_follows_the_run_shown(page, fake_server):
    """Queue, decoding and message counts come from the trace, so a replayed run cannot contradict them."""
    open_page(page, fake_server, WIDE)
    roles = [m["role"] for m in TRACE["request"]["messages"]]
    assert f"carries {len(roles)} messages" in step_text(page, "input")
    assert "nothing was ahead" in step_text(page, "queue")
    assert "Greedy decoding, which this run uses" in step_text(page, "first-token")
    # A sampled run with two messages and one request ahead, replayed through the lab's event.
    trace = json.loads(json.dumps(TRACE))
    trace["request"]["messages"] = trace["request"]["messages"][-2:]
    trace["request"]["messages"][0] = {"role": "system", "content": "Be brief."}
    trace["request"]["sampling"] = {"temperature": 0.7, "top_k": None, "top_p": 0.9, "seed": 1}
    for e in trace["events"]:
        if e["type"] == "queued":
            e["ahead"], e["position"] = 1, 2
    trace["prompt"]["tokens"] = [dict(t, message=min(t.get("message", 0) or 0, 1)) for t in trace["prompt"]["tokens"]]
    page.evaluate("(t) => document.dispatchEvent(new CustomEvent('kvscope:replay-trace', { detail: t }))", trace)
    expect(page.locator("#stage-input")).to_contain_text("carries 2 messages")
    assert "1 request was ahead" in step_text(page, "queue")
    assert "sampled (temperature 0.7)" in step_text(page, "first-token")
    assert "Greedy decoding, which" not in step_text(page, "first-token")


def test_smollm2_preset_says_published_bf16_and_what_this_site_runs(page, fake_server):
    open_page(page, fake_server, WIDE)
    page.select_option("#kvc-preset", "smollm2-135m")
    card = page.locator('#calculator [data-out="preset-card"]').inner_text()
    assert "bf16" in card and "Q4_1 GGUF" in card and "float32" in card
