"""bench/baselines.py's prefill FLOP count against the golden cases in static/data/kv_golden.json
(`prefill_flops`); tests/browser/test_lab.py checks the lab's JS count against the same cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.baselines import Shape

GOLDEN = json.loads((Path(__file__).resolve().parents[2] / "static/data/kv_golden.json").read_text())
CASES = GOLDEN["prefill_flops"]["cases"]


def shape_of(s: dict) -> Shape:
    return Shape(
        params=s["params"],
        weights_bytes=0,
        layers=s["layers"],
        attention_heads=s["attention_heads"],
        head_dim=s["head_dim"],
        hidden_size=s["hidden_size"],
        vocab_size=s["vocab_size"],
        bytes_per_element=4,
        kv_bytes_per_token=0,
        tied_embeddings=s["tied_embeddings"],
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
def test_prefill_flops_match_the_golden_cases(case):
    assert shape_of(case["shape"]).prefill_flops(case["tokens"]) == case["flops"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["id"])
def test_golden_cases_differ_from_two_times_all_params(case):
    """The old lab count, 2 x params x tokens, is not the definition (it charges a logits row per prompt token)."""
    assert case["naive"] == 2 * case["shape"]["params"] * case["tokens"]
    if case["tokens"] > 1:
        assert case["flops"] != case["naive"]
