"""Nothing a link, a paste or a typed value holds breaks the calculator: the three links that once left it on "could
not load its data" open a working panel with a message naming what was set aside; random and hostile query
strings and config.json files (odd keys, types and sizes, prototype-named keys) leave no page error, no console
error and Object.prototype untouched, and the panel still answers an edit; number fields commit on Enter, refuse
what does not read and say why."""

from __future__ import annotations

import json
import random
import re
from urllib.parse import urlencode

import pytest
from calculator_page import CALC, enter, field, open_calc, out
from playwright.sync_api import expect

PROTOTYPE = """() => ({
  names: Object.getOwnPropertyNames(Object.prototype).sort().join(','),
  polluted: ({}).polluted === undefined && ({}).kind === undefined && ({}).layers === undefined,
})"""
URL_KEYS = [
    "preset",
    "layers",
    "heads",
    "kvh",
    "hd",
    "dtype",
    "ctx",
    "seq",
    "block",
    "mem",
    "params",
    "wdtype",
    "mix",
    "scale",
    "g",
    "sb",
    "zp",
    "tp",
    "sdtype",
    "conv",
    "vspace",
    "vlen",
    "cfg",
    "round",
    "img",
]
HOSTILE = [
    "",
    "-1",
    "0",
    "1e400",
    "NaN",
    "Infinity",
    "9007199254740993",
    "99999999999",
    "__proto__",
    "constructor",
    "toString",
    "1.5",
    "0x10",
    " 8 ",
    "８",
    "💥",
    "x" * 3000,
    "%00",
    "null",
    "[]",
    "{}",
    "true",
]


def assert_usable(page, baseline: dict) -> None:
    """The panel computes, an edit still answers, and nothing reached Object.prototype."""
    expect(page.locator(f'{CALC}[data-ready="true"]')).to_be_attached(timeout=30_000)
    expect(out(page, "total").locator(".kvc-exact")).to_contain_text(" B")
    before = out(page, "per-seq").inner_text()
    enter(page, "seq", "2" if field(page, "seq").input_value() != "2" else "3")
    expect(out(page, "per-seq")).to_have_text(before)  # one sequence's bytes do not depend on how many
    assert page.evaluate(PROTOTYPE) == baseline


@pytest.fixture
def baseline(page, fake_server):
    open_calc(page, fake_server)
    return page.evaluate(PROTOTYPE)


LINKS = [
    ("tp the model cannot split", {"preset": "smollm2-135m", "tp": "2"}, "tp: 2 GPUs cannot split 3 KV heads"),
    (
        "tp that does not divide the attention heads (Falcon-7B: 71, one KV head)",
        {"preset": "custom", "layers": "32", "heads": "71", "kvh": "1", "hd": "64", "tp": "2"},
        "tp: 2 GPUs cannot split 71 attention heads (num_attention_heads) evenly",
    ),
    (
        "sizes past 2^53 bytes",
        {"preset": "custom", "layers": "256", "kvh": "128", "hd": "512", "ctx": "10485760", "seq": "256"},
        "ctx: the total passes 2^53 bytes",
    ),
    (
        "a config whose layer_types holds constructor",
        {
            "preset": "pasted",
            "cfg": json.dumps(
                {"num_hidden_layers": 1, "num_attention_heads": 8, "hidden_size": 512, "layer_types": ["constructor"]}
            ),
        },
        'layer_types: 1 unknown entry, the first layer_types[0] = "constructor"',
    ),
]


@pytest.mark.parametrize(("what", "query", "message"), LINKS, ids=[w for w, _, _ in LINKS])
def test_a_link_the_arithmetic_refuses_opens_with_a_message(
    page, fake_server, baseline, console_errors, what, query, message
):
    open_calc(page, fake_server, "?" + urlencode(query))
    expect(out(page, "calc-error")).to_contain_text(message)
    expect(out(page, "calc-error")).to_contain_text("Set aside")
    expect(out(page, "loading")).to_be_hidden()
    assert_usable(page, baseline)
    assert console_errors == [], what


def test_the_smollm2_link_keeps_the_model_and_drops_only_the_gpus(page, fake_server, console_errors):
    open_calc(page, fake_server, "?preset=smollm2-135m&tp=2&ctx=1024&block=1")
    expect(page.locator("#kvc-preset")).to_have_value("smollm2-135m")
    expect(field(page, "tp")).to_have_value("1")
    expect(out(page, "total").locator(".kvc-exact")).to_have_text(f"{23_040 * 1024:,} B")
    assert "tp=1" in page.url  # the refused value is not kept in the address either
    assert console_errors == []


def test_random_and_hostile_links_leave_a_working_panel(page, fake_server, baseline, console_errors):
    rng = random.Random(20261201)
    for i in range(24):
        keys = rng.sample(URL_KEYS, rng.randint(1, 8))
        query = {
            k: rng.choice([*HOSTILE, str(rng.randint(-5, 1 << 40)), "cfg:deepseek-v3", "pasted", "live"]) for k in keys
        }
        if rng.random() < 0.3:
            query["cfg"] = json.dumps(
                {"__proto__": {"polluted": 1}, "num_hidden_layers": rng.choice([1, "2", 1e9, None])}
            )
        page.goto(f"{fake_server.url}/?{urlencode(query)}")
        assert_usable(page, baseline)
        assert console_errors == [], (i, query)


HOSTILE_CONFIGS = [
    (
        "prototype keys",
        '{"__proto__": {"polluted": true, "kind": "full"}, "constructor": {"prototype": {"layers": 1}}, '
        '"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 512}',
    ),
    (
        "layer_types a string",
        {"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 512, "layer_types": "full_attention"},
    ),
    (
        "layer_types odd values",
        {
            "num_hidden_layers": 4,
            "num_attention_heads": 8,
            "hidden_size": 512,
            "layer_types": [None, 1, {}, "__proto__"],
        },
    ),
    ("numbers as text", {"num_hidden_layers": "32", "num_attention_heads": 8, "hidden_size": 512}),
    ("too large for a double", '{"num_hidden_layers": 1e400, "num_attention_heads": 8, "hidden_size": 512}'),
    ("text_config a list", {"text_config": [1, 2], "num_hidden_layers": 2}),
    (
        "text_config with prototype keys",
        '{"text_config": {"__proto__": {"x": 1}, "num_hidden_layers": 2, '
        '"num_attention_heads": 4, "hidden_size": 256, "layer_types": ["toString", "full_attention"]}}',
    ),
    (
        "4,096 layers of types",
        {
            "num_hidden_layers": 4096,
            "num_attention_heads": 8,
            "hidden_size": 512,
            "layer_types": ["sliding_attention", "full_attention"] * 2048,
            "sliding_window": 1024,
        },
    ),
    ("deep nesting", "[" * 20000 + "]" * 20000),
    ("not an object", "[1, 2, 3]"),
    ("empty", ""),
]


@pytest.mark.parametrize(("what", "config"), HOSTILE_CONFIGS, ids=[w for w, _ in HOSTILE_CONFIGS])
def test_a_hostile_config_is_answered_and_the_panel_stays(page, fake_server, baseline, console_errors, what, config):
    box = page.locator(f"{CALC} details.kvc-config")
    box.locator("summary").click()
    field(page, "config").fill(config if isinstance(config, str) else json.dumps(config))
    page.locator(f'{CALC} [data-action="read-config"]').click()
    # Either read (the status says what) or refused (the error names a field): never silence, never a crash.
    said = page.locator(f'{CALC} [data-out="config-status"], {CALC} [data-out="config-error"]')
    expect(said.filter(has_text=re.compile(r"\S")).first).to_be_visible()
    assert_usable(page, baseline)
    assert console_errors == [], what


def test_paste_and_upload_share_one_size_limit_and_a_file_chosen_twice_is_read_twice(page, fake_server, console_errors):
    open_calc(page, fake_server)
    page.locator(f"{CALC} details.kvc-config summary").click()
    big = json.dumps({"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 512, "pad": "x" * (2 << 20)})
    page.evaluate(
        "([sel, text]) => { document.querySelector(sel).value = text; }", [f'{CALC} [data-field="config"]', big]
    )
    page.locator(f'{CALC} [data-action="read-config"]').click()
    expect(out(page, "config-error")).to_contain_text("more than the 1,048,576 B this calculator reads")
    upload = field(page, "config-file")
    upload.set_input_files({"name": "big.json", "mimeType": "application/json", "buffer": big.encode()})
    expect(out(page, "config-error")).to_contain_text("big.json is 2,097,")
    expect(out(page, "config-error")).to_contain_text("more than the 1,048,576 B this calculator reads")
    small = json.dumps(
        {"model_type": "RefinedWebModel", "n_layer": 32, "n_head": 71, "hidden_size": 4544, "multi_query": True}
    )
    for _ in range(2):
        field(page, "config").fill("")
        upload.set_input_files({"name": "falcon.json", "mimeType": "application/json", "buffer": small.encode()})
        expect(out(page, "config-status")).to_contain_text("Read falcon.json")
        expect(field(page, "config")).to_have_value(small)
    expect(out(page, "per-token").locator(".kvc-exact")).to_have_text("8,192 B")
    assert console_errors == []


def test_number_fields_commit_on_enter_refuse_what_does_not_read_and_say_why(page, fake_server, console_errors):
    open_calc(page, fake_server, "?block=1")
    total = out(page, "total").locator(".kvc-exact")
    expect(total).to_have_text("1,073,741,824 B")
    ctx = field(page, "ctx")
    ctx.fill("")
    ctx.press_sequentially("1e3")
    expect(total).to_have_text("1,073,741,824 B")  # nothing used while typing: not a context of 1
    ctx.press("Enter")
    expect(total).to_have_text(f"{131_072 * 1000:,} B")
    expect(ctx).to_have_value("1000")
    enter(page, "ctx", "99999999999")
    expect(out(page, "input-error")).to_contain_text("Context length: must be a whole number from 1 to 10,485,760")
    expect(ctx).to_have_attribute("aria-invalid", "true")
    expect(total).to_have_text(f"{131_072 * 1000:,} B")
    enter(page, "ctx", "10485760")  # Llama 4 Scout's published context is allowed
    expect(out(page, "input-error")).to_have_text("")
    expect(total).to_have_text(f"{131_072 * 10_485_760:,} B")
    enter(page, "params", "8")
    weights = out(page, "weights").inner_text()
    enter(page, "params", "1e400")
    expect(out(page, "fit-error")).to_contain_text("Parameters (billions): must be a number from 0 to 5,000")
    expect(out(page, "weights")).to_have_text(weights)  # the weights stay, not cleared
    assert console_errors == []
