"""Attention inspection on the real model (SmolLM2-135M-Instruct, float32): for a 3-turn chat, every
streamed `attention` event matches the eager, cache-free forward with `output_attentions=True` over
the same tokens, and each layer's weights sum to 1."""

from __future__ import annotations

from attention_reference import check_against, eager_weights
from kvscope_testkit import events_of

from model_runner.protocol.request import parse_generate
from model_runner.text.prompt import plan

TOL = 2e-4  # float32: sdpa over the paged pool vs eager over the whole sequence, plus the wire's 5 decimals
CHAT = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What does a KV cache store?"},
    {"role": "assistant", "content": "The keys and values of every earlier token, for each layer."},
    {"role": "user", "content": "Why not the queries too?"},
    {"role": "assistant", "content": "A query is used once, by its own token, so keeping it saves nothing."},
    {"role": "user", "content": "So what does each new token read?"},
]


def test_streamed_attention_matches_the_eager_reference_for_a_three_turn_chat(engine_factory):
    engine = engine_factory("default", dtype="float32")
    params = parse_generate({"messages": CHAT, "max_new_tokens": 6, "inspect": {"attention": True}})
    events = events_of(engine.submit(params, "chat"), timeout=120)
    attention = [e for e in events if e["type"] == "attention"]
    tokens = [e for e in events if e["type"] == "token"]
    assert [a["index"] for a in attention] == [t["index"] for t in tokens] and attention
    engine.shutdown()  # the reference switches the model's attention: no worker may be running it
    model = engine.loaded.model
    prompt = plan(engine.loaded.tokenizer, params, engine.loaded.facts.context_window).ids
    history = prompt + [t["id"] for t in tokens]
    assert attention[0]["positions"] == len(prompt)
    for event in attention:
        check_against(event, eager_weights(model, history[: event["query_position"] + 1]), TOL)
