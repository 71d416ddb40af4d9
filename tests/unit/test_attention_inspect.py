"""Attention inspection on the fake model (a real 2-layer Llama with grouped-query attention): the
`attention` events match an eager, cache-free reference forward; only inspected requests get them,
in a shared batch too; inspection changes no token; bad `inspect` fields are refused by name."""

from __future__ import annotations

import pytest
import torch
from attention_reference import check_against, eager_weights
from kvscope_testkit import ask, events_of

from model_runner.local.model.attention_inspect import BINS, TOP_K, sharpest_heads, summarize
from model_runner.protocol.errors import UserError
from model_runner.protocol.request import parse_generate
from model_runner.text.prompt import plan

TOL = 1e-4  # float32 sdpa vs eager, and the wire's 5 decimals


def by_type(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["type"] == kind]


def prompt_ids(engine, params) -> list[int]:
    return plan(engine.loaded.tokenizer, params, engine.loaded.facts.context_window).ids


SHARPEN = 300.0  # the fake's initial queries spread ~1/n on every position, which any formula would match


def sharpened(engine):
    """The engine's fake model with its queries scaled up, so its heads focus on a few positions."""
    with torch.no_grad():
        for layer in engine.loaded.model.base.model.layers:
            layer.self_attn.q_proj.weight.mul_(SHARPEN)
    return engine


def test_streamed_attention_matches_an_eager_forward_without_cache(engine_factory):
    engine = sharpened(engine_factory("fake"))
    params = ask("What is a KV cache?", system="Be brief.", max_new_tokens=12, inspect={"attention": True})
    events = events_of(engine.submit(params, "r"))
    attention, tokens = by_type(events, "attention"), by_type(events, "token")
    assert [a["index"] for a in attention] == [t["index"] for t in tokens] == list(range(12))
    types = [e["type"] for e in events]
    assert all(types[types.index("attention") + 2 * i + 1] == "token" for i in range(12))  # each just before its token
    engine.shutdown()  # the reference switches the model's attention: no worker may be running it
    history = prompt_ids(engine, params) + [t["id"] for t in tokens]
    base = engine.loaded.model.base
    for event in attention:
        n = event["query_position"] + 1
        check_against(event, eager_weights(base, history[:n]), TOL)
    assert max(layer["sharpest"]["top"][0][1] for layer in attention[-1]["layers"]) > 0.3  # far from 1/n


def test_only_inspected_requests_get_attention_and_no_token_changes(engine_factory):
    engine = engine_factory("fake")
    plain = ask("Tell me about caches.", max_new_tokens=10)
    lone = [t["id"] for t in by_type(events_of(engine.submit(plain, "lone")), "token")]
    with engine.admissions_held():  # both admitted in one step, so they share every forward
        watched = engine.submit(ask("Tell me about caches.", max_new_tokens=10, inspect={"attention": True}), "w")
        other = engine.submit(plain, "o")
    watched_events, other_events = events_of(watched), events_of(other)
    assert len(by_type(watched_events, "attention")) == 10
    assert by_type(other_events, "attention") == []
    assert max(t["batch_size"] for t in by_type(other_events, "token")) == 2
    assert [t["id"] for t in by_type(other_events, "token")] == lone
    assert [t["id"] for t in by_type(watched_events, "token")] == lone


def test_chunked_prefill_inspects_the_chunk_that_yields_the_first_token(engine_factory):
    engine = engine_factory("fake")
    params = ask("x" * 40, max_new_tokens=3, prefill_chunk=16, inspect={"attention": True})
    events = events_of(engine.submit(params, "c"))
    first = by_type(events, "attention")[0]
    assert first["index"] == 0 and first["positions"] == events[0]["prompt_tokens"]
    assert len(by_type(events, "prefill_chunk")) > 1


def test_summary_keeps_the_top_positions_a_histogram_and_the_lowest_entropy_head():
    n = 40
    flat = torch.full((n,), 1 / n)
    spike = torch.full((n,), 0.1 / (n - 1))
    spike[7] = 0.9
    weights = torch.stack([flat, spike])[None]  # [1 layer, 2 heads, n]
    head, entropy = sharpest_heads(weights)
    assert head.tolist() == [1] and entropy[0] < torch.log(torch.tensor(float(n)))
    out = summarize(weights)
    assert out["positions"] == n and out["query_position"] == n - 1
    assert out["bin_width"] == 3 and len(out["all"]["bins"]) == 14 <= BINS  # ceil(40 / 16) = 3 positions a bin
    layer = out["layers"][0]
    assert layer["sharpest"]["head"] == 1 and layer["sharpest"]["top"][0] == [7, 0.9]
    assert layer["mean"]["top"][0] == [7, round(0.45 + 0.5 / n, 5)] and len(layer["mean"]["top"]) == TOP_K
    assert abs(sum(layer["mean"]["bins"]) - 1) < 1e-4
    assert layer["mean"]["bins"][2] == pytest.approx(
        layer["mean"]["top"][0][1] + 2 * (0.5 / n + 0.05 / (n - 1)), abs=1e-4
    )


@pytest.mark.parametrize(
    "inspect, field",
    [
        ("attention", "inspect"),
        ({"attn": True}, "inspect.attn"),
        ({"attention": "yes"}, "inspect.attention"),
    ],
)
def test_bad_inspect_fields_are_refused_by_name(inspect, field):
    with pytest.raises(UserError) as err:
        parse_generate({"messages": [{"role": "user", "content": "hi"}], "inspect": inspect})
    assert err.value.field == field


def test_inspection_needs_the_kv_cache():
    with pytest.raises(UserError, match="needs the cache") as err:
        parse_generate(
            {"messages": [{"role": "user", "content": "hi"}], "kv_cache": False, "inspect": {"attention": True}}
        )
    assert err.value.field == "inspect.attention"
    assert parse_generate({"messages": [{"role": "user", "content": "hi"}]}).inspect_attention is False
