"""The families the calculator once read silently wrong, on the page: MiniCPM3 counted as vLLM caches it with each
engine's figure listed and cited, Mllama's per-image term shown apart from the per-token one and scaled by the
"Images per request" field, RecurrentGemma's window and float32 state; a plain model lists no engines."""

from __future__ import annotations

import json
from pathlib import Path

from calculator_page import CALC, enter, field, open_calc, out
from playwright.sync_api import expect

GOLDEN = {
    c["id"]: c
    for c in json.loads((Path(__file__).resolve().parents[2] / "static/data/kv_golden.json").read_text())[
        "config_cases"
    ]
}


def paste(page, config: dict) -> None:
    box = page.locator(f"{CALC} details.kvc-config")
    if box.get_attribute("open") is None:
        box.locator("summary").click()
    field(page, "config").fill(json.dumps(config, indent=1))
    page.locator(f'{CALC} [data-action="read-config"]').click()
    expect(out(page, "config-error")).to_have_text("")


def total_is(page, n: int) -> None:
    expect(out(page, "total").locator(".kvc-exact").first).to_have_text(f"{n:,} B")


def test_minicpm3_is_counted_as_vllm_caches_it_and_each_engine_is_named(page, fake_server, console_errors):
    open_calc(page, fake_server, "?block=1")
    enter(page, "ctx", "1")
    paste(page, GOLDEN["minicpm3-4b-1"]["config_json"])
    total_is(page, 952_320)
    engines = out(page, "engines")
    expect(engines).to_be_visible()
    expect(engines).to_contain_text("vLLM 0.32.0: 952,320 B per token")
    expect(engines).to_contain_text("minicpm3.py")
    expect(engines).to_contain_text("transformers 5.23.0: 35,712 B per token")
    expect(engines).to_contain_text("modeling_minicpm3.py")
    expect(engines).to_contain_text("llama.cpp (as vendored in llama-cpp-python 0.3.36): 793,600 B per token")
    # With v_head_dim given, the one formula (793,600 B) differs from vLLM's count only by V padded from 64 to 96,
    # and the page says that rather than blaming the head numbers.
    paste(page, {**GOLDEN["minicpm3-4b-1"]["config_json"], "v_head_dim": 64})
    total_is(page, 952_320)
    expect(out(page, "naive-bytes")).to_contain_text("793,600 B")
    expect(out(page, "naive-why")).to_contain_text("vLLM padding V from v_head_dim 64 to qk_nope + qk_rope")
    expect(out(page, "naive-why")).not_to_contain_text("other head numbers")
    assert console_errors == []


def test_longcat_flash_counts_both_mla_attentions_of_each_layer(page, fake_server, console_errors):
    open_calc(page, fake_server, "?block=1")
    enter(page, "ctx", "1")
    paste(page, GOLDEN["longcat-flash-two-mla-per-layer-1"]["config_json"])
    total_is(page, 64_512)
    expect(out(page, "engines")).to_contain_text("holds two DeepseekV2MLAAttention (self_attn.0, self_attn.1)")
    assert console_errors == []


def test_mllama_shows_the_per_image_term_apart_and_counts_each_image(page, fake_server, console_errors):
    case = GOLDEN["mllama-11b-vision-1000-one-image"]
    per_image = 8 * 4 * 1601 * 2 * 8 * 128 * 2
    open_calc(page, fake_server, "?block=1")
    enter(page, "ctx", "1000")
    paste(page, case["config_json"])
    total_is(page, case["sequence_bytes"])
    expect(out(page, "per-token")).to_contain_text("131,072 B")
    expect(out(page, "formula")).to_contain_text(f"each image adds {per_image:,} B per sequence")
    enter(page, "images", "3")
    total_is(page, 32 * 1000 * 2 * 8 * 128 * 2 + 3 * per_image)
    expect(out(page, "formula")).to_contain_text("× 3 images per request")
    expect(out(page, "groups-table").locator('tr[data-kind="cross"]')).to_contain_text("19,212 (images)")
    expect(out(page, "engines")).to_contain_text("last served in 0.10.2")
    enter(page, "images", "65")  # past the limit: refused, named, the last value stays
    expect(field(page, "images")).to_have_attribute("aria-invalid", "true")
    total_is(page, 32 * 1000 * 2 * 8 * 128 * 2 + 3 * per_image)
    assert console_errors == []


def test_recurrentgemma_keeps_its_window_and_its_float32_state(page, fake_server, console_errors):
    case = GOLDEN["recurrentgemma-2b-131k"]
    open_calc(page, fake_server, "?block=1")
    enter(page, "ctx", "131072")
    paste(page, case["config_json"])
    total_is(page, 17_238_016)
    formula = out(page, "formula")
    expect(formula).to_contain_text("18 linear-attention / state-space layers")
    expect(formula).to_contain_text("2,560 recurrent × 4 B (kept in float32)")
    expect(out(page, "engines")).to_contain_text("not in vLLM 0.32.0's model registry")
    expect(out(page, "engines")).to_contain_text("does not dispatch through the Transformers attention interface")
    assert console_errors == []


def test_a_plain_model_lists_no_engines(page, fake_server):
    open_calc(page, fake_server, "?preset=cfg:smollm2-135m")
    expect(out(page, "engines")).to_be_hidden()
