"""The calculator's layer groups in Chromium: bundled and pasted config.json files (MLA, sliding window, chunked
local, hybrid state, shared layers) read into the exact bytes the golden file holds, storage and tensor
parallelism, bad input named while the last valid numbers stay, the live model's weights as they are held,
and kv-layers.js / kv-config.js against every golden case."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from calculator_page import CALC, field, open_calc, out
from kvscope_testkit import screenshot
from playwright.sync_api import expect

from formulas import kv_config, kv_layers, kv_math

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = json.loads((ROOT / "static/data/kv_golden.json").read_text())
CATALOGUE = {m["id"]: m for m in json.loads((ROOT / "static/data/model-configs.json").read_text())["models"]}
CONFIG_CASES = {c["id"]: c for c in GOLDEN["config_cases"]}


def open_config_box(page) -> None:
    box = page.locator(f"{CALC} details.kvc-config")
    if box.get_attribute("open") is None:
        box.locator("summary").click()


def paste_config(page, config: dict) -> None:
    open_config_box(page)
    field(page, "config").fill(json.dumps(config, indent=1))
    page.locator(f'{CALC} [data-action="read-config"]').click()


def shows_bytes(page, name: str, n: int) -> None:
    expect(out(page, name).locator(".kvc-exact").first).to_have_text(f"{n:,} B")


@pytest.mark.parametrize(
    ("kind", "case_id"),
    [
        ("MLA", "deepseek-v3-128k"),
        ("sliding window", "gpt-oss-120b-128k"),
        ("chunked local", "llama-4-scout-8k"),
        ("hybrid state", "jamba-v0.1-256k"),
        ("linear attention", "qwen3-next-80b-256k"),
        ("shared layers", "gemma-3n-e4b-32k"),
    ],
)
def test_a_pasted_config_gives_the_golden_bytes(page, fake_server, kind, case_id, console_errors):
    case = CONFIG_CASES[case_id]
    open_calc(page, fake_server)
    field(page, "ctx").fill(str(case["tokens"]))
    paste_config(page, CATALOGUE[case["config"]]["config"])
    expect(page.locator("#kvc-preset")).to_have_value("pasted")
    shows_bytes(page, "total", case["sequence_bytes"])
    expect(out(page, "config-error")).to_have_text("")
    if "naive_bytes" in case:
        shows_bytes(page, "naive-bytes", case["naive_bytes"])
        ratio = case["naive_bytes"] / case["sequence_bytes"]
        expect(out(page, "naive-ratio")).to_have_text(f"{ratio:.2f}×")
        expect(out(page, "naive-why")).to_contain_text("They differ because")
    rows = out(page, "groups-table").locator("tbody tr")
    expect(rows).to_have_count(len(kv_config.read_config(CATALOGUE[case["config"]]["config"])["groups"]))
    assert console_errors == [], kind


def test_a_config_typed_key_by_key_reads_like_a_pasted_one(page, fake_server):
    open_calc(page, fake_server)
    field(page, "ctx").fill("1000")
    open_config_box(page)
    # A small MLA model typed into the box: 2 layers × (256 + 32) × 2 B × 1,000 positions.
    field(page, "config").press_sequentially(
        '{"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256, "kv_lora_rank": 256, "qk_rope_head_dim": 32}'
    )
    page.locator(f'{CALC} [data-action="read-config"]').click()
    shows_bytes(page, "total", 2 * 288 * 2 * 1000)
    expect(out(page, "formula")).to_contain_text("(256 latent + 32 RoPE) × 2 B = 576 B per position per layer")
    expect(out(page, "formula")).to_contain_text("no factor 2")
    keys = out(page, "config-keys")
    expect(keys).to_contain_text("kv_lora_rank → MLA latent rank: 256")
    expect(keys).to_contain_text("num_kv_shared_layers")  # the default it took, named
    expect(keys.locator("em").first).to_contain_text("not in the file")
    expect(keys).not_to_contain_text("not in the file: not in the file")


@pytest.mark.parametrize(
    ("model_id", "per_token"),
    [("deepseek-v3", 70_272), ("qwen2.5-72b", 327_680), ("llama-3.1-405b", 516_096)],
)
def test_the_bundled_configs_give_the_published_per_token_figures(page, fake_server, model_id, per_token):
    """Liu et al. 2025 (the DeepSeek-V3 ISCA paper): 70.272, 327.680 and 516.096 KB per token in bf16."""
    open_calc(page, fake_server)
    field(page, "ctx").fill("1")
    page.select_option("#kvc-preset", f"cfg:{model_id}")
    shows_bytes(page, "per-token", per_token)
    shows_bytes(page, "total", per_token)
    card = out(page, "preset-card")
    expect(card.locator(".tag-cited")).to_have_text("cited")
    expect(card.locator("a")).to_have_attribute("href", CATALOGUE[model_id]["url"])


def test_a_bundled_key_no_copy_of_its_file_confirmed_is_marked_unchecked(page, fake_server):
    open_calc(page, fake_server)
    page.select_option("#kvc-preset", "cfg:jamba-v0.1")
    keys = out(page, "config-keys")
    for key in CATALOGUE["jamba-v0.1"]["unchecked"]:
        if key in ("num_hidden_layers", "num_key_value_heads"):  # keys every reading uses
            expect(keys.locator("li", has_text=f"{key} →")).to_contain_text("(unchecked)")
    page.select_option("#kvc-preset", "cfg:deepseek-v3")  # re-read against a whole copy: nothing unchecked
    expect(keys).not_to_contain_text("(unchecked)")


def test_bad_configs_name_the_field_and_keep_the_last_valid_numbers(page, fake_server):
    open_calc(page, fake_server)
    shows_bytes(page, "total", kv_math.GIB)
    for case in GOLDEN["config_error_cases"]:
        paste_config(page, case["config_json"])
        for name in case["error_fields"]:
            expect(out(page, "config-error"), case["id"]).to_contain_text(f"{name}:")
        expect(field(page, "config"), case["id"]).to_have_attribute("aria-invalid", "true")
        shows_bytes(page, "total", kv_math.GIB)
        expect(page.locator("#kvc-preset")).to_have_value("reference")
    field(page, "config").fill("{not json")
    page.locator(f'{CALC} [data-action="read-config"]').click()
    expect(out(page, "config-error")).to_contain_text("config.json: not valid JSON")
    shows_bytes(page, "total", kv_math.GIB)


def test_storage_scales_blocks_and_tensor_parallelism(page, fake_server):
    open_calc(page, fake_server)
    field(page, "ctx").fill("1000")
    field(page, "dtype").select_option("int4")
    field(page, "scale").select_option("group")
    field(page, "groupSize").select_option("32")
    shows_bytes(page, "per-token", 36_864)  # (1,024 + 128) × 32, the golden int4-group32 case
    field(page, "scale").select_option("none")
    field(page, "dtype").select_option("fp16")
    field(page, "round").select_option("16")
    shows_bytes(page, "total", 131_072 * 1008)
    field(page, "round").select_option("1")
    field(page, "tp").select_option("16")  # 8 KV heads on 16 GPUs: each head held twice
    shows_bytes(page, "total", 2 * 131_072 * 1000)
    expect(out(page, "per-gpu")).to_contain_text(f"{16_384 * 1000:,} B")
    expect(out(page, "per-gpu")).to_contain_text("on each of 16 GPUs")
    expect(out(page, "naive-why")).to_contain_text("16 GPUs each hold a copy")
    # SmolLM2 has 3 KV heads: 2 GPUs cannot split them. The field is named; the last numbers stay.
    # Choosing a model 16 GPUs cannot hold is refused the same way, naming the field.
    page.select_option("#kvc-preset", "cfg:smollm2-135m")
    expect(out(page, "calc-error")).to_contain_text("tp: 16 GPUs cannot split 3 KV heads")
    expect(page.locator("#kvc-preset")).to_have_value("reference")
    field(page, "tp").select_option("1")
    page.select_option("#kvc-preset", "cfg:smollm2-135m")
    expect(out(page, "calc-error")).to_have_text("")
    shows_bytes(page, "total", 23_040 * 1000)
    field(page, "tp").select_option("2")
    expect(out(page, "calc-error")).to_contain_text("tp: 2 GPUs cannot split 3 KV heads")
    shows_bytes(page, "total", 23_040 * 1000)
    expect(field(page, "tp")).to_have_value("1")


def test_memory_plan_counts_the_per_sequence_state(page, fake_server):
    open_calc(page, fake_server)
    page.select_option("#kvc-preset", "cfg:jamba-v0.1")
    field(page, "ctx").fill("8192")
    field(page, "seq").fill("4")
    field(page, "mem").fill("80")
    field(page, "params").fill("10")
    groups = kv_config.read_config(CATALOGUE["jamba-v0.1"]["config"])["groups"]
    plan = kv_layers.fit(groups, {}, 80 * kv_math.GIB, 10 * 10**9 * 2, 8192, 4, 1 << 20)
    expect(page.locator(f'{CALC} [data-out="fit-seqs"]')).to_have_text(f"{plan['sequences']:,} sequences")
    expect(page.locator(f'{CALC} [data-out="fit-tokens"]')).to_have_text(f"{plan['tokens']:,} tokens")


def test_catalogue_and_storage_round_trip_through_the_url(page, fake_server):
    open_calc(page, fake_server)
    page.select_option("#kvc-preset", "cfg:gemma-3-27b")
    field(page, "ctx").fill("131072")
    field(page, "dtype").select_option("fp8")
    field(page, "round").select_option("16")
    expected = kv_layers.cache_bytes(
        kv_config.read_config(CATALOGUE["gemma-3-27b"]["config"])["groups"],
        131072,
        1,
        {"kv_dtype": "fp8", "block_size": 16},
    )["total_bytes"]
    shows_bytes(page, "total", expected)
    query = parse_qs(urlsplit(page.url).query)
    assert query["preset"] == ["cfg:gemma-3-27b"] and query["round"] == ["16"]
    fresh = page.context.new_page()
    fresh.goto(page.url)
    expect(fresh.locator(f'{CALC}[data-ready="true"]')).to_be_attached()
    expect(fresh.locator(f'{CALC} [data-out="total"] .kvc-exact')).to_have_text(f"{expected:,} B")


def test_a_pasted_config_travels_in_the_link(page, fake_server):
    open_calc(page, fake_server)
    paste_config(page, CATALOGUE["gpt-oss-120b"]["config"])
    fresh = page.context.new_page()
    fresh.goto(page.url)
    expect(fresh.locator(f'{CALC}[data-ready="true"]')).to_be_attached()
    expect(fresh.locator("#kvc-preset")).to_have_value("pasted")
    total = CONFIG_CASES["gpt-oss-120b-100"]
    fresh.locator(f'{CALC} [data-field="ctx"]').fill("100")
    expect(fresh.locator(f'{CALC} [data-out="total"] .kvc-exact')).to_have_text(f"{total['sequence_bytes']:,} B")


@pytest.fixture
def int8_fake_server(live_server):
    """The fake model on the int8 weight route: weights held as int8 with scales, KV cache float32."""
    return live_server("fake", args=("--dtype", "int8"))


def test_the_live_preset_counts_the_weights_as_the_route_holds_them(page, int8_fake_server):
    facts = json.loads(page.request.get(f"{int8_fake_server.url}/api/model").text())["facts"]
    assert facts["weights_dtype"] == "int8" and facts["bytes_per_element"] == 4
    open_calc(page, int8_fake_server, "?preset=live")
    expect(page.locator('#kvc-preset option[value="live"]')).to_be_enabled()
    page.select_option("#kvc-preset", "live")
    weights = out(page, "weights")
    expect(weights).to_contain_text(f"{facts['weights_bytes']:,} B")
    expect(weights.locator(".tag-measured")).to_have_text("measured")
    expect(weights).to_contain_text("int8")
    assert f"{facts['params'] * 4:,} B" not in weights.inner_text()  # not params × the cache's 4 bytes
    expect(field(page, "wdtype")).to_have_value("int8")
    expect(field(page, "dtype")).to_have_value("fp32")
    shows_bytes(page, "per-token", facts["kv_bytes_per_token"])


def test_intro_says_prefix_caching_can_keep_the_history(page, fake_server):
    open_calc(page, fake_server)
    intro = page.locator(".kvc-intro").inner_text()
    assert "prefills it from the start" in intro and "prefix caching" in intro


def test_the_js_twins_reproduce_every_golden_layer_and_config_case(page, fake_server):
    open_calc(page, fake_server)
    failures = page.evaluate("""async () => {
      const L = await import('/static/js/calculator/kv-layers.js');
      const C = await import('/static/js/calculator/kv-config.js');
      const g = await (await fetch('/static/data/kv_golden.json')).json();
      const cat = Object.fromEntries((await (await fetch('/static/data/model-configs.json')).json()).models.map((m) => [m.id, m]));
      const names = { per_gpu_sequence_bytes: 'perGpuSequenceBytes', per_gpu_fixed_bytes: 'perGpuFixedBytes',
        sequence_bytes: 'sequenceBytes', total_bytes: 'totalBytes', per_token_bytes: 'perTokenBytes' };
      const bad = [];
      for (const c of g.layer_cases) {
        const r = L.cacheBytes(c.groups, c.tokens, c.sequences, c.storage);
        for (const [py, js] of Object.entries(names)) if (py in c && r[js] !== c[py]) bad.push(`${c.id} ${py}: ${r[js]}`);
      }
      for (const c of g.layer_error_cases) {
        try { L.cacheBytes(c.groups, c.tokens, c.sequences, c.storage); bad.push(`${c.id}: no error`); }
        catch (e) { if (e.field !== c.error_field) bad.push(`${c.id}: ${e.field}`); }
      }
      for (const c of g.config_cases) {
        const read = C.readConfig(c.config_json || cat[c.config].config);
        if (read.errors.length) { bad.push(`${c.id}: ${JSON.stringify(read.errors)}`); continue; }
        const got = L.cacheBytes(read.groups, c.tokens, 1, {}).sequenceBytes;
        if (got !== c.sequence_bytes) bad.push(`${c.id}: ${got}`);
        if (c.naive_bytes && L.naiveBytes(read.naive, c.tokens, 1, 'fp16') !== c.naive_bytes) bad.push(`${c.id} naive`);
      }
      for (const c of g.config_error_cases) {
        const f = JSON.stringify(C.readConfig(c.config_json).errors.map((e) => e.field));
        if (f !== JSON.stringify(c.error_fields)) bad.push(`${c.id}: ${f}`);
      }
      return { bad, count: g.layer_cases.length + g.layer_error_cases.length + g.config_cases.length + g.config_error_cases.length };
    }""")
    assert failures["bad"] == []
    assert failures["count"] >= 40


def test_the_js_reader_lists_the_same_keys_as_the_python_one(page, fake_server):
    open_calc(page, fake_server)
    js = page.evaluate("""async () => {
      const C = await import('/static/js/calculator/kv-config.js');
      const cat = (await (await fetch('/static/data/model-configs.json')).json()).models;
      return Object.fromEntries(cat.map((m) => { const r = C.readConfig(m.config); return [m.id, [r.groups, r.used]]; }));
    }""")
    for model_id, model in CATALOGUE.items():
        read = kv_config.read_config(model["config"])
        assert js[model_id] == [read["groups"], read["used"]], model_id


@pytest.mark.parametrize("width", [375, 1440])
def test_layer_groups_fit_the_screen(page, fake_server, width, console_errors):
    page.set_viewport_size({"width": width, "height": 900})
    open_calc(page, fake_server)
    page.select_option("#kvc-preset", "cfg:gemma-3n-e4b")
    field(page, "ctx").fill("32768")
    shows_bytes(page, "total", CONFIG_CASES["gemma-3n-e4b-32k"]["sequence_bytes"])
    page.locator(f"{CALC} details.kvc-keys summary").click()
    overflow = page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0
    for part, name in (
        ("[data-out='formula']", "formula"),
        ("[data-out='groups-table']", "groups"),
        ("[data-out='config-keys']", "keys"),
    ):
        page.locator(f"{CALC} {part}").evaluate("el => el.scrollIntoView({block: 'center'})")
        screenshot(page, f"calculator-layers-{name}-{width}")
    open_config_box(page)
    page.locator(f"{CALC} details.kvc-config").evaluate("el => el.scrollIntoView()")
    screenshot(page, f"calculator-layers-config-{width}")
    assert console_errors == []
