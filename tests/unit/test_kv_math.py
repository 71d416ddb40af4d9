"""formulas.kv_math against the golden cases in static/data/kv_golden.json (the browser tests use the same file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from formulas import kv_config, kv_layers, kv_math

GOLDEN = json.loads((Path(__file__).resolve().parents[2] / "static/data/kv_golden.json").read_text())
PRESETS = {p["id"]: p for p in GOLDEN["presets"]}
ELEMENT_BYTES = {e["id"]: e["bytes"] for e in GOLDEN["element_types"]}


def arch(case: dict) -> tuple[int, int, int, float]:
    preset = PRESETS[case["preset"]]
    dtype = case.get("dtype", preset["dtype"])
    return preset["layers"], preset["kv_heads"], preset["head_dim"], ELEMENT_BYTES[dtype]


def case_id(case: dict) -> str:
    return case["id"]


@pytest.mark.parametrize("preset", GOLDEN["presets"], ids=case_id)
def test_every_preset_states_its_bytes_per_token(preset):
    bpe = ELEMENT_BYTES[preset["dtype"]]
    assert (
        kv_math.kv_bytes_per_token(preset["layers"], preset["kv_heads"], preset["head_dim"], bpe)
        == preset["bytes_per_token"]
    )


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=case_id)
def test_golden_cache_sizes(case):
    assert kv_math.kv_bytes_per_token(*arch(case)) == case["bytes_per_token"]
    assert kv_math.kv_cache_bytes(*arch(case), case["tokens"], case["sequences"]) == case["total_bytes"]


def test_the_issue_figures_are_in_the_golden_file():
    """The figures the reference texts quote must stay among the golden cases, whatever else changes."""
    totals = {c["id"]: c["total_bytes"] for c in GOLDEN["cases"]}
    assert totals["reference-8k-1"] == kv_math.GIB
    assert totals["reference-8k-2"] == 2 * kv_math.GIB
    assert totals["reference-1200-1"] == 157_286_400
    assert round(totals["reference-1200-32"] / kv_math.GIB, 2) == 4.69
    assert round(totals["opt-13b-2048"] / kv_math.GIB, 2) == 1.56
    per_token = {c["id"]: c["bytes_per_token"] for c in GOLDEN["cases"]}
    assert (per_token["smollm2-bf16"], per_token["smollm2-fp32"], per_token["opt-13b-2048"]) == (
        23_040,
        46_080,
        819_200,
    )


@pytest.mark.parametrize("case", GOLDEN["allocation_cases"], ids=case_id)
def test_golden_allocation(case):
    bpt = kv_math.kv_bytes_per_token(*arch(case))
    got = kv_math.allocation(case["lengths"], case["block_size"], case["max_tokens"], bpt)
    assert got == {k: case[k] for k in got}


@pytest.mark.parametrize("case", GOLDEN["reverse_cases"], ids=case_id)
def test_golden_reverse_solve(case):
    preset = PRESETS[case["preset"]]
    bpt = kv_math.kv_bytes_per_token(*arch(case))
    weights = kv_math.weights_bytes(preset["params"] or 0, ELEMENT_BYTES[preset["dtype"]])
    assert weights == case["weights_bytes"]
    memory = case["memory_gib"] * kv_math.GIB
    assert kv_math.max_sequences(memory, weights, bpt, case["tokens"]) == case["max_sequences"]
    assert kv_math.max_tokens(memory, weights, bpt, case["sequences"]) == case["max_tokens"]


@given(length=st.integers(1, 131_072), block=st.sampled_from([1, 8, 16, 32, 64, 128, 256]))
def test_paged_waste_is_less_than_one_block(length, block):
    reserved = kv_math.paged_tokens(length, block)
    assert reserved % block == 0
    assert 0 <= reserved - length < block


@given(
    bpt=st.integers(1, 10**8),
    tokens=st.integers(1, 131_072),
    memory=st.integers(0, 2**45),
    weights=st.integers(0, 2**40),
)
def test_reverse_solve_is_the_largest_count_that_fits(bpt, tokens, memory, weights):
    n = kv_math.max_sequences(memory, weights, bpt, tokens)
    fits = lambda k: weights + k * bpt * tokens <= memory  # noqa: E731
    assert n == 0 or fits(n)
    assert not fits(n + 1)


# ---- layer groups (formulas.kv_layers) and config.json reading (formulas.kv_config) -------------------

CATALOGUE = {
    m["id"]: m
    for m in json.loads((Path(__file__).resolve().parents[2] / "static/data/model-configs.json").read_text())["models"]
}


def worked(expression: str) -> int:
    """A golden case's hand-written arithmetic ("61 × (512 + 64) × 2"), evaluated without the code under test."""
    value = eval(expression.replace("×", "*"), {"__builtins__": {}})  # noqa: S307 - our own data file
    assert value == int(value), expression
    return int(value)


@pytest.mark.parametrize("case", GOLDEN["layer_cases"], ids=case_id)
def test_layer_groups_give_the_golden_bytes(case):
    for key, expression in case["worked"].items():
        assert worked(expression) == case[key], f"{case['id']}: worked {key} disagrees with the stored number"
    got = kv_layers.cache_bytes(case["groups"], case["tokens"], case["sequences"], case["storage"])
    for key in ("per_gpu_sequence_bytes", "per_gpu_fixed_bytes", "sequence_bytes", "total_bytes", "per_token_bytes"):
        if key in case:
            assert got[key] == case[key], key


@pytest.mark.parametrize("case", GOLDEN["layer_error_cases"], ids=case_id)
def test_bad_layer_input_names_the_field(case):
    with pytest.raises(kv_layers.KvInputError) as err:
        kv_layers.cache_bytes(case["groups"], case["tokens"], case["sequences"], case["storage"])
    assert err.value.field == case["error_field"]


def config_of(case: dict) -> dict:
    return case["config_json"] if "config_json" in case else CATALOGUE[case["config"]]["config"]


@pytest.mark.parametrize("case", GOLDEN["config_cases"], ids=case_id)
def test_configs_read_into_the_golden_bytes(case):
    assert worked(case["worked"]) == case["sequence_bytes"]
    read = kv_config.read_config(config_of(case))
    assert read["errors"] == []
    got = kv_layers.cache_bytes(read["groups"], case["tokens"], 1, {})
    assert got["sequence_bytes"] == case["sequence_bytes"]
    if "naive_bytes" in case:
        assert worked(case["naive_worked"]) == case["naive_bytes"]
        assert kv_layers.naive_bytes(read["naive"], case["tokens"], 1, "fp16") == case["naive_bytes"]


@pytest.mark.parametrize("case", GOLDEN["config_error_cases"], ids=case_id)
def test_bad_configs_name_the_field(case):
    read = kv_config.read_config(case["config_json"])
    assert [e["field"] for e in read["errors"]] == case["error_fields"]
    assert all(e["message"] for e in read["errors"])


def test_the_published_per_token_figures_come_out_exactly():
    """Liu et al. 2025 (DeepSeek-V3 ISCA paper): 70.272 KB, 327.680 KB and 516.096 KB per token, decimal KB, bf16."""
    per_token = {
        name: kv_layers.cache_bytes(kv_config.read_config(CATALOGUE[name]["config"])["groups"], 1, 1, {})[
            "sequence_bytes"
        ]
        for name in ("deepseek-v3", "qwen2.5-72b", "llama-3.1-405b")
    }
    assert per_token == {"deepseek-v3": 70_272, "qwen2.5-72b": 327_680, "llama-3.1-405b": 516_096}


def test_every_catalogue_config_reads_cleanly_and_names_its_keys():
    for model_id, model in CATALOGUE.items():
        read = kv_config.read_config(model["config"])
        assert read["errors"] == [], model_id
        assert model["url"].startswith("https://huggingface.co/") and model["read_from"], model_id
        keys = {u["key"].removeprefix("text_config.") for u in read["used"]}
        assert "num_hidden_layers" in keys, model_id
        assert len([c for c in GOLDEN["config_cases"] if c.get("config") == model_id]) >= 2, model_id


def test_a_default_the_file_leaves_out_is_named_with_whose_default_it_is():
    read = kv_config.read_config(CATALOGUE["gemma-3-27b"]["config"])
    pattern = next(u for u in read["used"] if u["key"] == "text_config.sliding_window_pattern")
    assert pattern["value"] == 6 and "Gemma3TextConfig" in pattern["default"]


def test_reverse_solve_with_a_per_sequence_state_and_windows():
    groups = kv_config.read_config(CATALOGUE["jamba-v0.1"]["config"])["groups"]
    one = kv_layers.cache_bytes(groups, 8192, 1, {})["sequence_bytes"]
    plan = kv_layers.fit(
        groups, {}, memory=80 * kv_math.GIB, weights=10 * kv_math.GIB, tokens=8192, sequences=4, max_tokens=1 << 24
    )
    assert plan["sequences"] == (70 * kv_math.GIB) // one
    at = lambda t: 4 * kv_layers.cache_bytes(groups, t, 1, {})["sequence_bytes"]  # noqa: E731
    assert at(plan["tokens"]) <= 70 * kv_math.GIB < at(plan["tokens"] + 1)
    # A model whose every layer is windowed stops growing: the longest T is the search's limit.
    windowed = [{"kind": "sliding", "layers": 2, "kv_heads": 1, "head_dim": 8, "window": 16}]
    assert kv_layers.fit(windowed, {}, 10**9, 0, 16, 1, 1 << 20)["tokens"] == 1 << 20


@pytest.mark.parametrize("case", GOLDEN["engine_log_cases"], ids=case_id)
def test_an_engines_logged_cache_size_is_blocks_of_our_bytes(case):
    """vLLM logs its KV memory and its block count: the blocks times our bytes per block (Llama-3.1-8B, bf16,
    16 positions a block) give the logged GiB to its two decimals, and the tokens it says it can hold."""
    block = case["storage"]["block_size"]
    page = kv_layers.cache_bytes(case["groups"], block, 1, case["storage"])["sequence_bytes"]
    assert page == 16 * 131_072
    assert round(case["blocks"] * page / kv_math.GIB, 2) == case["logged_gib"]
    plan = kv_layers.fit(case["groups"], case["storage"], case["blocks"] * page, 0, block, 1, 1 << 20)
    assert plan["tokens"] == case["blocks"] * block
    if case["logged_tokens"]:
        assert plan["tokens"] == case["logged_tokens"]
