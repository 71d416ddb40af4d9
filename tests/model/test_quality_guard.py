"""Quality guard for the fast CPU default: greedy answers of what `--dtype auto` runs on this CPU (int4
on AVX2 and AVX-512) against float32's on the fixed chat prompts of static/data/quality_prompts.json,
one request at a time, token for token; the guard's bound (identical on at least 20 of 24), and the
share of tokens docs/performance.md states."""

from __future__ import annotations

import pytest
from kvscope_testkit import events_of

from bench.dtypes import agreement, quality_messages, quality_prompts
from model_runner.request import parse_generate

NEW_TOKENS = 32
# Per route `auto` can pick: answers identical over all 32 tokens (20 of 24), and float32's
# tokens produced before an answer's first difference (docs/performance.md: 92 % measured under AVX2).
MIN_SHARES = {"int4": (20 / 24, 0.85)}


def answers(engine) -> list[list[int]]:
    out = []
    for messages in quality_messages(quality_prompts()):
        events = events_of(engine.submit(parse_generate({"messages": messages, "max_new_tokens": NEW_TOKENS})), 120)
        assert events[-1]["type"] == "finished", events[-1]
        out.append([e["id"] for e in events if e["type"] == "token"])
    return out


def test_the_fast_default_greedy_answers_agree_with_float32(shared_engine):
    reference_engine = shared_engine("default", dtype="float32")
    fast_engine = shared_engine("default")  # dtype auto: the same engine as the real_engine fixture
    route = fast_engine.facts.dtype_route
    if route not in MIN_SHARES:
        pytest.skip(f"auto runs {route} on this CPU ({fast_engine.facts.dtype_reason}): nothing to compare")
    assert fast_engine.facts.weights_dtype == route and fast_engine.facts.kv_dtype == "float32"
    min_identical, min_tokens = MIN_SHARES[route]
    reference, fast = answers(reference_engine), answers(fast_engine)
    result = agreement(fast, reference)
    firsts = ", ".join(f"prompt {d['request']} at token {d['token']}" for d in result["first_diff"]) or "none"
    report = (
        f"{route}: {result['identical']}/{result['compared']} answers identical over {NEW_TOKENS} tokens, "
        f"{result['tokens_before_divergence_share']:.0%} of float32's tokens before the first difference; "
        f"first differences: {firsts}"
    )
    print(report)
    assert result["compared"] == len(reference) >= 20
    assert result["identical"] >= min_identical * result["compared"] - 1e-9, report  # counts: the share is rounded
    assert result["tokens_before_divergence_share"] >= min_tokens, report
