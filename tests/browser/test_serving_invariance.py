"""The serving chapter's "Why the same prompt can answer differently" section in Debian's Chromium: it draws
the shipped recording (static/data/invariance-trace.json) with its values, its two sentences are the ones
worked out here from that recording, every number is labelled, it fits at 375 and 1440 px; "Run it for real"
works from the keyboard and then draws the fake-model server's answer, with its sentences recomputed; without
a recording no number is shown."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from js_format import fixed, fmt_ms
from kvscope_testkit import screenshot
from playwright.sync_api import expect
from test_provenance import KINDS, STRUCTURAL, WALK

from serving_experiments.contract import check_response

ROOT = Path(__file__).resolve().parents[2]
RECORDING_PATH = ROOT / "static/data/invariance-trace.json"
SECTION = "#serving-invariance"
NARROW, WIDE = {"width": 375, "height": 740}, {"width": 1440, "height": 900}
NEAR_TIE = 0.1  # static/js/serving/batch-invariance-math.js


def same_bits(run: dict) -> tuple[int, int, bool]:
    upto = [r["parts_at"] if r["parts_at"] is not None else r["compared_tokens"] for r in run["requests"]]
    exact = all(r["parts_at"] is None or r["same_prob_tokens"] == 0 for r in run["requests"])
    return sum(min(r["same_prob_tokens"], u) for r, u in zip(run["requests"], upto)), sum(upto), exact


BFLOAT16_INPUTS = ("int4", "int8")  # routes whose decode matmuls round their inputs to bfloat16


def default_sentence(result: dict, machine: dict) -> str:
    """batch-invariance-math.js defaultClaim, worked out from the data."""
    run = result["runs"]["default"]
    same = sum(r["same_answer"] for r in run["requests"])
    text = (
        f"In this run, on the default route, {same} of {len(run['requests'])} answers came back from the batch "
        "as they were alone"
    )
    p = run["first_parting"]
    if p and p["alone"]["logit_gap"] is not None and p["batched"]["logit_gap"] is not None:
        a, b = p["alone"]["logit_gap"], p["batched"]["logit_gap"]
        way = " the other way" if math.copysign(1, a) != math.copysign(1, b) else ""
        tail = (
            f": a near-tie (under {NEAR_TIE} logits), tipped by a changed sum" if max(abs(a), abs(b)) < NEAR_TIE else ""
        )
        if machine.get("route") in BFLOAT16_INPUTS:  # the amplifier: a changed sum rounds to another bfloat16 input
            tail += (
                f". The gap moved by {fixed(abs(a - b), 4)} logits, far more than reordering a float32 sum moves it: "
                f"on the {machine['route']} route each linear layer of a decode step rounds its inputs to bfloat16 "
                "(8 significant bits), "
                "so a sum that changed in its lowest bits can round to the next bfloat16 value, a step of 0.4 to 0.8 % "
                "of its size, and the layers after carry that step forward."
            )
        else:
            tail += "."
        text += (
            f". Request {p['request']} parted at token {p['index'] + 1}, where its two candidates were "
            f"{fixed(abs(a), 4)} apart in logits alone and {fixed(abs(b), 4)} apart{way} in the batch{tail}"
        )
    else:
        text += "."
    kept, compared, exact = same_bits(run)
    changed = compared - kept
    if compared and (changed or exact):
        parted = any(r["parts_at"] is not None for r in run["requests"])
        text += " Counting each answer up to where it parted, if it did, " if parted else " Over the whole answers, "
        text += (
            f"{'' if exact else 'at least '}{changed:,} of {compared:,} tokens were chosen with a probability that "
            "was not the same float as alone: the sums changed even where the choice held."
            if changed
            else f"all {compared:,} tokens were chosen with the same probability, to the last bit, as alone."
        )
    return text


def mode_sentence(result: dict, machine: dict, recorded_on: dict | None) -> str:
    """batch-invariance-math.js modeClaim, worked out from the data and the load it ran at (start and end for a
    recording, the answer's own for a live run)."""
    run, base = result["runs"]["invariant"], result["runs"]["default"]
    same = sum(r["same_answer"] for r in run["requests"])
    text = f"With the mode on, {same} of {len(run['requests'])} answers were the lone ones"
    kept, compared, exact = same_bits(run)
    if compared and exact:
        text += (
            ", every token's probability the same to the last bit"
            if kept == compared
            else ", though not every token's probability was the same to the last bit"
        )
    a, b = base["step_ms_median"], run["step_ms_median"]
    ratios = [b["alone"] / a["alone"], b["batched"] / a["batched"]]
    text += (
        f". Its median step took ×{fixed(ratios[0], 2)} the default's for a lone request "
        f"({fmt_ms(a['alone'])} to {fmt_ms(b['alone'])}) and ×{fixed(ratios[1], 2)} in the batch "
        f"({fmt_ms(a['batched'])} to {fmt_ms(b['batched'])})"
    )
    loads = [recorded_on["load_1m"], recorded_on["load_1m_end"]] if recorded_on else [machine["load_1m"]]
    if max(loads) > machine["threads"]:
        return text + (
            f", but at a load of {' → '.join(fixed(x, 2) for x in loads)} on {machine['threads']} threads these "
            "times are mostly the other processes' share of the machine, not the mode's cost."
        )
    if all(r > 1 for r in ratios):
        return text + ": the padding rows, the row-by-row attention and the separate prompt passes cost time."
    if all(r < 1 for r in ratios):
        return text + "; the mode was not slower in this run."
    return text + "."


def open_section(page, server, viewport, recording: str | None):
    if recording is None:
        page.route("**/invariance-trace.json", lambda route: route.fulfill(status=404, body="not found"))
    page.set_viewport_size(viewport)
    page.goto(server.url + "/" + SECTION)
    section = page.locator(SECTION)
    section.scroll_into_view_if_needed()
    return section


def check_drawn(page, response: dict, recorded_on: dict | None = None) -> None:
    section, result = page.locator(SECTION), response["result"]
    expect(section.locator('[data-claim="invariance-default"]')).to_have_text(
        default_sentence(result, response["machine"])
    )
    expect(section.locator('[data-claim="invariance-mode"]')).to_have_text(
        mode_sentence(result, response["machine"], recorded_on)
    )
    loads = [recorded_on["load_1m"], recorded_on["load_1m_end"]] if recorded_on else [response["machine"]["load_1m"]]
    expect(section.locator(".sv-inv-source")).to_contain_text(
        f"{result['requests']} questions, up to {result['new_tokens']} new tokens each, load {' → '.join(fixed(x, 2) for x in loads)}"
    )
    for name in ("default", "invariant"):
        run = result["runs"][name]
        col = section.locator(f'.sv-col[data-run="{name}"]')
        same = sum(r["same_answer"] for r in run["requests"])
        expect(col.locator(f'[data-key="{name}-same"]')).to_have_text(f"{same} of {len(run['requests'])}")
        expect(col.locator("tbody tr").first).to_contain_text(run["requests"][0]["request"])
        # the request count is a setting of the run; a rate is tokens over a measured time: computed
        expect(col.locator(f'[data-key="{name}-same"] [data-setting]')).to_have_text(str(len(run["requests"])))
        rates = col.locator('td[data-label="tokens/s"] [data-provenance]')
        assert set(rates.evaluate_all("(vs) => vs.map((v) => v.dataset.provenance)")) == {"computed"}
    assert page.evaluate(WALK, [SECTION, STRUCTURAL, KINDS]) == []


@pytest.mark.skipif(not RECORDING_PATH.exists(), reason="no recording shipped yet (scripts/record_invariance_trace.py)")
@pytest.mark.parametrize("viewport", [WIDE, NARROW], ids=["1440", "375"])
def test_the_section_draws_the_shipped_recording_with_its_sentences(page, fake_server, console_errors, viewport):
    recording = json.loads(RECORDING_PATH.read_text(encoding="utf-8"))
    assert check_response("batch_invariance", recording["experiment"]) == []
    open_section(page, fake_server, viewport, recording=RECORDING_PATH.read_text())
    expect(page.locator(f"{SECTION} .sv-inv-source")).to_contain_text(recording["recorded_on"]["machine"])
    check_drawn(page, recording["experiment"], recording["recorded_on"])
    gap = recording["experiment"]["result"]["runs"]["default"]["first_parting"]
    if gap:  # the logit gap shown is ln of the two probabilities' ratio
        p = gap["alone"]["probs"]
        assert math.isclose(gap["alone"]["logit_gap"], math.log(p[0] / p[1]))
    overflow = page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0
    screenshot(page, f"serving-invariance-{viewport['width']}")
    assert console_errors == []


def test_without_a_recording_no_number_is_shown_and_the_live_run_draws_the_servers_answer(
    page, fake_server, console_errors
):
    section = open_section(page, fake_server, WIDE, recording=None)
    expect(section.locator(".sv-inv-source")).to_have_text("No recorded run ships with the page.")
    assert section.locator(".sv-inv-figure").inner_text().strip() == ""
    assert all(n.is_hidden() for n in section.locator("[data-claim]").all())
    run = section.locator(".sv-inv-run")
    expect(run).to_be_enabled(timeout=60_000)
    run.focus()
    with page.expect_response(lambda r: r.url.endswith("/api/experiments/batch_invariance"), timeout=300_000) as answer:
        page.keyboard.press("Enter")
    response = answer.value.json()
    assert answer.value.status == 200, response
    assert check_response("batch_invariance", response) == []
    expect(section.locator(".sv-inv-source")).to_contain_text("Live run", timeout=30_000)
    expect(section.locator(".sv-inv-source .sv-decoder")).to_have_text(response["machine"]["decoder"])
    check_drawn(page, response)
    invariant = response["result"]["runs"]["invariant"]
    assert invariant["report"]["on"] is True and all(r["same_answer"] for r in invariant["requests"])
    screenshot(page, "serving-invariance-live-1440")
    assert [e for e in console_errors if "invariance-trace.json" not in e] == []  # the 404 asked for
