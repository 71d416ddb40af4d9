"""Cases a review of the batched engine found: a failed step retried request by request keeps
every other request's cache exact, a prompt that started in chunks finishes when chunking is
switched off, the feed's `dropped` count sits at the gap, and the policy API and flags refuse
bad input with the documented shape."""

from __future__ import annotations

import argparse

import pytest
from kvscope_testkit import ask as gen
from kvscope_testkit import events_of

import model_runner.core.engine as engine_module
from app import create_app
from app.cli import policy_of
from model_runner.core.engine import Engine, EngineConfig
from model_runner.core.feed import EngineFeed
from model_runner.core.scheduler import Policy
from model_runner.errors import UserError
from model_runner.loading.fake import ANSWER
from model_runner.loading.loader import load


def test_a_failed_step_retried_alone_keeps_the_other_requests_cache_exact(engine_factory, monkeypatch):
    engine = engine_factory("fake:delay=10")
    recompute = engine_module.recompute_forward
    failures = []

    def fail_once(model, seq):
        if not failures:
            failures.append(seq.id)
            raise RuntimeError("injected recompute failure")
        return recompute(model, seq)

    monkeypatch.setattr(engine_module, "recompute_forward", fail_once)
    cached = engine.submit(gen(max_new_tokens=30), "cached")
    free = engine.submit(gen(max_new_tokens=30, kv_cache=False), "no-cache")
    cached_events, free_events = events_of(cached), events_of(free)
    # The failure was passing: run again on its own, the cache-free request went on too.
    assert failures == ["no-cache"] and free_events[-1]["type"] == "finished"
    assert cached_events[-1]["type"] == "finished" and cached_events[-1]["text"] == ANSWER[:30]
    prompt = cached_events[0]["prompt_tokens"]
    tokens = [e for e in cached_events if e["type"] == "token"]
    assert [t["cache_tokens"] - prompt for t in tokens] == list(range(len(tokens)))


def test_a_prompt_that_started_in_chunks_finishes_when_chunking_is_switched_off(engine_factory):
    engine = engine_factory("fake:delay=10", policy=Policy(chunked_prefill=True, chunk_size=16, max_batch_tokens=64))
    decoding = engine.submit(gen(max_new_tokens=200), "decoding")
    long_one = engine.submit(gen("x" * 300, max_new_tokens=5), "long")
    while (event := long_one.next_event(30)) is not None and event.type != "prefill_chunk":
        pass
    engine.set_policy(chunked_prefill=False)
    rest = events_of(long_one)
    assert rest[-1]["type"] == "finished" and rest[-1]["tokens"] == 5
    chunks = [e for e in rest if e["type"] == "prefill_chunk"]
    assert chunks and chunks[-1]["end"] == next(e for e in rest if e["type"] == "prefill_end")["tokens"]
    decoding.cancel()
    assert events_of(decoding)[-1]["type"] == "cancelled"


def test_the_dropped_count_comes_with_the_first_event_after_the_gap():
    feed = EngineFeed()
    reader = feed.subscribe(capacity=2)
    for step in range(5):
        feed.publish("engine_step", step=step)
    first, second = reader.next_event(0), reader.next_event(0)
    feed.publish("engine_step", step=5)
    after_gap = reader.next_event(0)
    assert [first["step"], second["step"], after_gap["step"]] == [0, 1, 5]
    assert "dropped" not in first and "dropped" not in second and after_gap["dropped"] == 3
    assert reader.dropped == 3


@pytest.fixture(scope="module")
def policy_client():
    engine = Engine(EngineConfig(model="fake"), loaded=load("fake"))
    return create_app({"TESTING": True, "ENGINE": engine}).test_client()


@pytest.mark.parametrize(
    "body, code, field",
    [
        ('{"self": 1}', "invalid_request", "self"),
        ('{"max_num_seqs": 0}', "invalid_request", "max_num_seqs"),
        ("[1, 2]", "invalid_json", None),
        ("{oops", "invalid_json", None),
    ],
)
def test_the_policy_api_answers_bad_input_with_the_error_shape(policy_client, body, code, field):
    res = policy_client.post("/api/engine/policy", data=body, content_type="application/json")
    assert res.status_code == 400
    assert (res.get_json()["code"], res.get_json()["field"]) == (code, field)


def test_the_policy_api_changes_the_policy_on_a_loopback_server(policy_client):
    res = policy_client.post("/api/engine/policy", json={"batching": "static", "max_num_seqs": 4})
    assert res.status_code == 200 and res.get_json()["policy"]["batching"] == "static"
    assert policy_client.get("/api/engine").get_json()["policy"]["max_num_seqs"] == 4


def flags(**given):
    defaults = {"max_num_seqs": None, "batching": None, "prefix_caching": None, "chunked_prefill": None}
    return argparse.Namespace(**{**defaults, **given})


def test_serve_flags_add_to_the_environment_policy_instead_of_replacing_it(monkeypatch):
    monkeypatch.setenv("KVSCOPE_POLICY", '{"prefix_caching": true, "chunked_prefill": true}')
    assert policy_of(flags(max_num_seqs=4)) == {"prefix_caching": True, "chunked_prefill": True, "max_num_seqs": 4}
    assert policy_of(flags(chunked_prefill=0))["chunked_prefill"] is False
    monkeypatch.setenv("KVSCOPE_POLICY", '{"max_num_seqs": 0}')
    with pytest.raises(UserError) as info:
        policy_of(flags())
    assert info.value.field == "max_num_seqs"
