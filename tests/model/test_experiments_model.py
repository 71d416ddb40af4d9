"""Every serving-chapter experiment finishes on the product's model (SmolLM2-135M-Instruct, CPU) with
small parameters, answers the contract's shape, and restores the engine's policy."""

from __future__ import annotations

import pytest

from app import create_app
from serving_experiments.contract import check_response
from serving_experiments.registry import EXPERIMENTS

SMALL = {
    "why_batch": {"new_tokens": 3},
    "batching": {"requests": 3, "batch_size": 2, "new_tokens": 4},
    "paged_blocks": {"requests": 2, "new_tokens": 2},
    "chunked_prefill": {"chunk_size": 32, "long_prompt_tokens": 96, "new_tokens": 6},
    "prefix_caching": {"requests": 2, "new_tokens": 1},
    "speculative": {"new_tokens": 8},
    "pricing": {"prompt_tokens": 64, "new_tokens": 3},
}


@pytest.fixture(scope="module")
def client(real_engine):
    return create_app({"ENGINE": real_engine, "ALLOW_POLICY_CHANGES": True}).test_client()


@pytest.mark.parametrize("name", list(EXPERIMENTS))
def test_experiment_finishes_on_the_real_model(client, real_engine, name):
    before = real_engine.policy
    response = client.post(f"/api/experiments/{name}", json=SMALL[name])
    assert response.status_code == 200, response.json
    assert check_response(name, response.json) == []
    assert real_engine.policy == before
    result = response.json["result"]
    if name == "speculative":  # output equality is test_speculative.py's (float32); here the counts
        for case in result["cases"]:
            assert sum(s["accepted"] + (s["bonus"] is not None) for s in case["steps"]) == case["tokens"]
            assert case["identical"] == (case["diverged_at"] is None)
    if name == "pricing":
        assert result["prefill_ms_per_token"] > 0 and result["decode_ms_per_token"] > 0
