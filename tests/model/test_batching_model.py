"""Continuous batching on the product's model (SmolLM2-135M-Instruct, CPU): requests that share
engine steps get the same greedy tokens as when each runs alone (every one in float32, at least 7 of 8 on
the default route), the paged pool's bytes follow the formula at every step, and prefix caching skips
computing a shared prompt prefix."""

from __future__ import annotations

import threading

import pytest
from kvscope_testkit import ask, wait_until

QUESTIONS = [
    "What does a KV cache store?",
    "Name three colours.",
    "Why is the sky blue? Answer in one sentence.",
    "Write a haiku about the sea.",
    "What is a token, in a language model?",
    "Explain in two sentences why batching requests makes a GPU server faster for many users at once.",
    "Say hello.",
    "What is the capital of France, and which river runs through it?",
]
MAX_NEW = [24, 8, 20, 16, 12, 24, 6, 18]  # different output lengths: requests leave the batch at different steps
# Answers batched = alone, of 8. float32: every one. The default route (int4 on AVX2/AVX-512) rounds a
# decode step's matmul inputs to bfloat16, so a batch's last-bit differences in attention can still move
# a near-tie; its float32 logits keep that to the guard's bound (docs/performance.md measures it).
IDENTICAL_OF_8 = {"float32": 8, "auto": 7}


def token_ids(events):
    return [e["id"] for e in events if e["type"] == "token"]


def run_together(engine, params_list) -> list[list[dict]]:
    """Submit every request at once, read each stream on its own thread, return the events."""
    handles = [engine.submit(p, f"together-{i}") for i, p in enumerate(params_list)]
    results: list[list[dict]] = [[] for _ in handles]

    def read(i, handle):
        results[i] = [e.to_dict() for e in handle]

    threads = [threading.Thread(target=read, args=(i, h)) for i, h in enumerate(handles)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return results


@pytest.fixture(scope="module", params=sorted(IDENTICAL_OF_8))
def route(request):
    """(--dtype, its shared engine): float32 and what `auto` runs on this machine."""
    fixture = "real_engine_float32" if request.param == "float32" else "real_engine"
    return request.param, request.getfixturevalue(fixture)


@pytest.fixture(scope="module")
def alone_and_together(route):
    _, engine = route
    params = [ask(q, max_new_tokens=n) for q, n in zip(QUESTIONS, MAX_NEW)]
    alone = [[e.to_dict() for e in engine.submit(p, f"alone-{i}")] for i, p in enumerate(params)]
    together = run_together(engine, params)
    return alone, together


def test_eight_requests_batched_give_each_the_tokens_it_gets_alone(alone_and_together, route):
    alone, together = alone_and_together
    dtype, engine = route
    assert all(events[-1]["type"] == "finished" for events in alone + together)
    identical = [token_ids(a) == token_ids(t) for a, t in zip(alone, together)]
    print(f"{dtype} ({engine.facts.dtype_route}): {identical.count(True)} of 8 batched = alone")
    assert identical.count(True) >= IDENTICAL_OF_8[dtype], (
        f"{engine.facts.dtype_route}: {identical.count(False)} of 8 differ: "
        f"{[i for i, same in enumerate(identical) if not same]}"
    )
    # They really shared steps: most tokens of the batched run came from steps of several requests.
    sizes = [e["batch_size"] for events in together for e in events if e["type"] == "token" and e["index"] > 0]
    assert max(sizes) >= 4 and all(e["batch_size"] == 1 for e in alone[0] if e["type"] == "token")


def test_kv_bytes_follow_the_formula_at_every_step_of_a_batched_run(alone_and_together, route):
    _, together = alone_and_together
    per_block = route[1].pool.bytes_per_block
    assert per_block == 16 * route[1].facts.kv_bytes_per_token  # 16 positions × 46,080 B, float32 on every route
    for events in together:
        prompt = events[0]["prompt_tokens"]
        tokens = [e for e in events if e["type"] == "token"]
        assert [t["cache_tokens"] for t in tokens] == [prompt + i for i in range(len(tokens))]
        for t in tokens:
            assert t["cache_bytes_measured"] == t["cache_bytes_formula"] == t["cache_tokens"] * 46_080
            assert t["kv_blocks"] == -(-t["cache_tokens"] // 16)  # ceil: the blocks its positions need
            assert t["kv_bytes_reserved"] == t["kv_blocks"] * per_block >= t["cache_bytes_measured"]


def test_every_batched_request_gives_its_blocks_back(alone_and_together, route):
    assert route[1].active == 0
    assert route[1].pool.usage().used == 0


def test_prefix_caching_gives_the_same_text_and_skips_the_shared_prefix(real_engine):
    system = (
        "You are a patient tutor for a class on language models. Answer in plain words, in one or two "
        "sentences, and never use jargon without explaining it first. "
    ) * 2
    first, second = (ask("What is a KV cache?", system, max_new_tokens=12) for _ in range(2))
    real_engine.set_policy(prefix_caching=True)
    try:
        cold = [e.to_dict() for e in real_engine.submit(first, "prefix-cold")]
        warm = [e.to_dict() for e in real_engine.submit(second, "prefix-warm")]
    finally:
        real_engine.set_policy(prefix_caching=False)
    start_cold = next(e for e in cold if e["type"] == "prefill_start")
    start_warm = next(e for e in warm if e["type"] == "prefill_start")
    assert start_cold["cached_tokens"] == 0
    assert start_warm["cached_tokens"] >= 64 and start_warm["cached_tokens"] % 16 == 0
    assert start_warm["cached_tokens"] < start_warm["prompt_tokens"]  # at least one token is computed
    assert token_ids(warm) == token_ids(cold) and warm[-1]["text"] == cold[-1]["text"]
    # Turning prefix caching off gives the blocks kept for their prefix back to the pool.
    wait_until(lambda: real_engine.pool.usage().cached == 0, "the cached prefix blocks to be freed")
