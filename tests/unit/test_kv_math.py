"""model_runner.kv_math against the golden cases in static/data/kv_golden.json (the browser tests use the same file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from model_runner import kv_math

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
