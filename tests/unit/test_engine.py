"""The engine on the fake model (a real 2-layer Llama steered to spell a fixed answer over bytes)."""

from __future__ import annotations

import threading

import pytest
from kvscope_testkit import ask as gen
from kvscope_testkit import events_of, wait_until

import model_runner.local.step.forward as runner
from model_runner.loading.fake import ANSWER
from model_runner.protocol.errors import UserError
from model_runner.protocol.request import parse_generate
from model_runner.shared.policy import Policy


def run_all(engine, params, request_id="r"):
    return [e.to_dict() for e in engine.submit(params, request_id)]


@pytest.fixture
def slow_engine(engine_factory):
    """A batch of one request at a time: how the queue behaves whenever the batch is full."""
    return engine_factory("fake:delay=20", max_queue=4, policy=Policy(max_num_seqs=1))


def started(handle):
    """Read the handle until its prefill has begun: it is running, no longer waiting."""
    for event in iter(lambda: handle.next_event(10), None):
        if event.type == "prefill_start":
            return handle
    raise AssertionError("the request never started")


def terminals(events):
    return [e for e in events if e["type"] in ("finished", "cancelled", "error")]


def test_event_order_for_a_full_answer(fake_engine):
    events = run_all(fake_engine, gen(max_new_tokens=200))
    types = [e["type"] for e in events]
    assert types[:4] == ["accepted", "queued", "prefill_start", "prefill_end"]
    assert set(types[4:-1]) == {"token"} and types[-1] == "finished"
    tokens = [e for e in events if e["type"] == "token"]
    assert [t["index"] for t in tokens] == list(range(len(tokens)))
    assert tokens[0]["id"] == events[3]["first_token"]["id"]  # the first token comes from the prefill logits
    assert tokens[0]["step_ms"] == 0.0
    done = events[-1]
    assert done["reason"] == "eos" and done["text"] == ANSWER
    assert "".join(t["text"] for t in tokens) == ANSWER
    assert [e["t_ms"] for e in events] == sorted(e["t_ms"] for e in events)


def test_cache_grows_one_position_per_decode_step_and_matches_formula(fake_engine):
    events = run_all(fake_engine, gen(max_new_tokens=10))
    prompt = events[0]["prompt_tokens"]
    tokens = [e for e in events if e["type"] == "token"]
    assert [t["cache_tokens"] for t in tokens] == [prompt + i for i in range(10)]
    assert all(t["cache_bytes_measured"] == t["cache_bytes_formula"] > 0 for t in tokens)
    per_token = fake_engine.facts.kv_bytes_per_token
    assert tokens[-1]["cache_bytes_measured"] == per_token * (prompt + 9)


def test_max_tokens_stops_at_the_budget(fake_engine):
    done = run_all(fake_engine, gen(max_new_tokens=5))[-1]
    assert (done["reason"], done["tokens"], done["token_index"]) == ("max_tokens", 5, 4)
    assert done["text"] == ANSWER[:5]


def test_stop_string_split_across_tokens_is_matched_and_not_shown(fake_engine):
    # Every byte is its own token, so "fake model" spans ten tokens.
    events = run_all(fake_engine, gen(max_new_tokens=200, stop=["fake model"]))
    done = events[-1]
    assert done["reason"] == "stop_string"
    assert done["text"] == "Hello from the "
    streamed = "".join(e["text"] for e in events if e["type"] == "token")
    assert streamed == "Hello from the " and "fake" not in streamed


def test_split_utf8_character_is_pending_then_released_whole(fake_engine):
    events = run_all(fake_engine, gen(max_new_tokens=200))
    tokens = [e for e in events if e["type"] == "token"]
    emoji_at = next(i for i, t in enumerate(tokens) if "\U0001f600" in t["text"])
    assert [t["pending"] for t in tokens[emoji_at - 3 : emoji_at]] == [True, True, True]
    assert [t["text"] for t in tokens[emoji_at - 3 : emoji_at]] == ["", "", ""]
    assert tokens[emoji_at]["text"] == "\U0001f600" and not tokens[emoji_at]["pending"]
    assert all("\ufffd" not in t["text"] for t in tokens)


def test_temperature_zero_is_greedy_and_a_seed_reproduces_sampling(fake_engine):
    greedy = run_all(fake_engine, gen(max_new_tokens=40))[-1]["text"]
    assert run_all(fake_engine, gen(max_new_tokens=40, sampling={"temperature": 0}))[-1]["text"] == greedy
    sampled = [
        run_all(fake_engine, gen(max_new_tokens=40, sampling={"temperature": 1.5, "seed": s}))[-1]["text"]
        for s in (1, 1, 2)
    ]
    assert sampled[0] == sampled[1]
    assert sampled[0] != sampled[2]


def test_top_k_one_equals_greedy(fake_engine):
    greedy = run_all(fake_engine, gen(max_new_tokens=30))[-1]["text"]
    assert (
        run_all(fake_engine, gen(max_new_tokens=30, sampling={"temperature": 1.0, "top_k": 1, "seed": 3}))[-1]["text"]
        == greedy
    )


def test_no_cache_gives_the_same_greedy_text(fake_engine):
    on = run_all(fake_engine, gen(max_new_tokens=30))
    off = run_all(fake_engine, gen(max_new_tokens=30, kv_cache=False))
    assert on[-1]["text"] == off[-1]["text"]
    assert all(e["cache_tokens"] == 0 for e in off if e["type"] == "token")


def test_chunked_prefill_reports_each_chunk_and_gives_the_same_text(fake_engine):
    events = run_all(fake_engine, gen(max_new_tokens=20, prefill_chunk=16))
    chunks = [e for e in events if e["type"] == "prefill_chunk"]
    prompt = events[0]["prompt_tokens"]
    assert [c["start"] for c in chunks] == list(range(0, prompt, 16))
    assert chunks[-1]["end"] == prompt == chunks[-1]["cache_tokens"]
    assert events[-1]["text"] == run_all(fake_engine, gen(max_new_tokens=20))[-1]["text"]


def test_buffered_delivery_releases_text_only_with_the_finish(fake_engine):
    events = run_all(fake_engine, gen(max_new_tokens=20, delivery="buffered"))
    assert all(e["text"] == "" for e in events if e["type"] == "token")
    assert events[-1]["text"] == ANSWER[:20]
    assert events[-1]["metrics"]["first_text_ms"] == events[-1]["metrics"]["e2e_ms"]


def test_metrics_follow_vllm_definitions(fake_engine):
    events = run_all(fake_engine, gen(max_new_tokens=12))
    m = events[-1]["metrics"]
    tokens = [e for e in events if e["type"] == "token"]
    assert m["ttft_ms"] == pytest.approx(tokens[0]["t_ms"], abs=0.01)
    assert m["tpot_ms"] == pytest.approx((m["e2e_ms"] - m["ttft_ms"]) / 11, rel=1e-3)
    assert len(m["itl_ms"]) == 11
    assert m["queue_ms"] <= m["ttft_ms"] <= m["e2e_ms"]


# ---- context budget -------------------------------------------------------------------------------


def long_history(turns=6, words=20):
    msgs = []
    for i in range(turns):
        msgs += [
            {"role": "user", "content": f"question {i} " + "word " * words},
            {"role": "assistant", "content": f"answer {i} " + "reply " * words},
        ]
    return msgs + [{"role": "user", "content": "and now?"}]


def test_budget_reject_names_the_numbers(fake_engine):
    params = parse_generate({"messages": long_history(), "max_new_tokens": 200})
    with pytest.raises(UserError) as info:
        fake_engine.submit(params)
    assert info.value.code == "context_overflow" and info.value.field == "max_new_tokens"
    assert "+ max_new_tokens 200 =" in info.value.message and "> context window 512" in info.value.message


def test_budget_exactly_full_is_accepted_and_one_more_rejected(fake_engine):
    prompt = fake_engine.describe_prompt(gen(max_new_tokens=1))["counts"]["total"]
    fits = run_all(fake_engine, gen(max_new_tokens=512 - prompt))
    assert fits[0]["budget"]["total"] == 512 and fits[-1]["type"] == "finished"
    with pytest.raises(UserError):
        fake_engine.submit(gen(max_new_tokens=513 - prompt))


def test_budget_truncate_history_drops_oldest_turns(fake_engine):
    params = parse_generate({"messages": long_history(), "max_new_tokens": 200, "overflow": "truncate_history"})
    accepted = run_all(fake_engine, params)[0]
    budget = accepted["budget"]
    assert budget["action"] == "truncated_history" and budget["dropped_messages"] > 0
    assert budget["total"] <= 512 and budget["max_new_tokens"] == 200


def test_budget_shrink_output_lowers_max_new_tokens(fake_engine):
    params = parse_generate(
        {"messages": long_history(turns=1, words=30), "max_new_tokens": 500, "overflow": "shrink_output"}
    )
    accepted = run_all(fake_engine, params)[0]
    assert accepted["budget"]["action"] == "shrunk_output"
    assert accepted["max_new_tokens"] == 512 - accepted["prompt_tokens"] < 500


# ---- queue, cancel, timeout, failure: exactly one terminal event ----------------------------------


def test_second_request_waits_in_the_queue_and_sees_its_position(slow_engine):
    first = started(slow_engine.submit(gen(max_new_tokens=30), "a"))
    second = slow_engine.submit(gen(max_new_tokens=5), "b")
    events_b = [e.to_dict() for e in second]
    queued = [e for e in events_b if e["type"] == "queued"]
    assert queued[0]["position"] == 1 and queued[0]["ahead"] == 1
    events_a = [e.to_dict() for e in first]
    assert events_b[-1]["metrics"]["queue_ms"] > 30 * 20 * 0.5  # waited for most of a's 30 slow steps
    assert events_a[-1]["type"] == events_b[-1]["type"] == "finished"


def test_positions_move_up_when_the_queue_advances(slow_engine):
    handles = [started(slow_engine.submit(gen(max_new_tokens=8), "q0"))]
    handles += [slow_engine.submit(gen(max_new_tokens=8), f"q{i}") for i in (1, 2)]
    last = [e.to_dict() for e in handles[2]]
    assert [e["position"] for e in last if e["type"] == "queued"] == [2, 1]


def test_cancel_while_queued_is_never_prefilled(slow_engine):
    running = started(slow_engine.submit(gen(max_new_tokens=30), "run"))
    waiting = slow_engine.submit(gen(max_new_tokens=30), "wait")
    waiting.cancel()
    events = [e.to_dict() for e in waiting]
    assert [e["type"] for e in events] == ["accepted", "queued", "cancelled"]
    assert events[-1]["state"] == "queued" and events[-1]["cause"] == "client"
    assert terminals([e.to_dict() for e in running])[0]["type"] == "finished"


def test_cancel_during_decode_stops_within_one_step(slow_engine):
    handle = slow_engine.submit(gen(max_new_tokens=200), "c")
    seen = []
    for event in handle:
        seen.append(event.to_dict())
        if event.type == "token" and event.index == 3:
            handle.cancel()
    tokens = [e for e in seen if e["type"] == "token"]
    assert seen[-1]["type"] == "cancelled" and seen[-1]["state"] == "decode"
    assert len(tokens) <= 5  # the step in flight may finish, no more
    assert seen[-1]["tokens"] == len(tokens) and seen[-1]["text"] == ANSWER[: len(tokens)]
    assert len(terminals(seen)) == 1


def test_cancel_during_prefill_ends_the_request(slow_engine):
    handle = slow_engine.submit(gen(max_new_tokens=50, prefill_chunk=8), "p")
    seen = []
    for event in handle:
        seen.append(event.to_dict())
        if event.type == "prefill_chunk":
            handle.cancel()
    assert seen[-1]["type"] == "cancelled" and seen[-1]["state"] == "prefill"
    assert not [e for e in seen if e["type"] == "token"]


def test_cancel_after_the_end_changes_nothing(fake_engine):
    handle = fake_engine.submit(gen(max_new_tokens=3))
    events = list(handle)
    handle.cancel()
    assert handle.next_event(timeout=0.2) is None
    assert len(terminals([e.to_dict() for e in events])) == 1


def test_timeout_is_a_finish_reason(slow_engine):
    events = [e.to_dict() for e in slow_engine.submit(gen(max_new_tokens=200, timeout_s=0.3), "t")]
    assert events[-1]["type"] == "finished" and events[-1]["reason"] == "timeout"
    assert len(terminals(events)) == 1


def test_exception_in_a_model_step_fails_that_request_and_the_worker_lives(slow_engine, monkeypatch):
    decoder = slow_engine._forward.decoder  # the model's step, whichever decoder runs it
    real_run = decoder.run
    calls = {"n": 0}

    def flaky(step):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected fault")
        return real_run(step)

    monkeypatch.setattr(decoder, "run", flaky)
    failed = [e.to_dict() for e in slow_engine.submit(gen(max_new_tokens=10), "boom")]
    assert failed[-1]["type"] == "error" and failed[-1]["code"] == "internal"
    assert "injected fault" in failed[-1]["message"]
    assert len(terminals(failed)) == 1
    after = [e.to_dict() for e in slow_engine.submit(gen(max_new_tokens=5), "next")]
    assert after[-1]["type"] == "finished" and slow_engine.health()[0]


def test_a_failed_step_retried_alone_keeps_the_other_requests_cache_exact(engine_factory, monkeypatch):
    engine = engine_factory("fake:delay=10")
    recompute = runner.recompute_forward
    failures = []

    def fail_once(model, seq):
        if not failures:
            failures.append(seq.id)
            raise RuntimeError("injected recompute failure")
        return recompute(model, seq)

    monkeypatch.setattr(runner, "recompute_forward", fail_once)
    cached = engine.submit(gen(max_new_tokens=30), "cached")
    free = engine.submit(gen(max_new_tokens=30, kv_cache=False), "no-cache")
    cached_events, free_events = events_of(cached), events_of(free)
    # The failure was passing: run again on its own, the cache-free request went on too.
    assert failures == ["no-cache"] and free_events[-1]["type"] == "finished"
    assert cached_events[-1]["type"] == "finished" and cached_events[-1]["text"] == ANSWER[:30]
    prompt = cached_events[0]["prompt_tokens"]
    tokens = [e for e in cached_events if e["type"] == "token"]
    assert [t["cache_tokens"] - prompt for t in tokens] == list(range(len(tokens)))


def test_full_queue_answers_overloaded_at_once(slow_engine):
    handles = [started(slow_engine.submit(gen(max_new_tokens=50), "h0"))]
    handles += [slow_engine.submit(gen(max_new_tokens=50), f"h{i}") for i in range(1, 5)]  # 4 waiting: the cap
    with pytest.raises(UserError) as info:
        slow_engine.submit(gen(max_new_tokens=5))
    assert info.value.code == "overloaded"
    for h in handles:
        h.cancel()
    assert all(terminals([e.to_dict() for e in h])[0]["type"] == "cancelled" for h in handles)


def test_concurrent_cancels_from_many_threads_give_one_terminal_each(slow_engine):
    handles = [slow_engine.submit(gen(max_new_tokens=100), f"m{i}") for i in range(4)]
    threads = [threading.Thread(target=h.cancel) for h in handles for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for h in handles:
        assert len(terminals([e.to_dict() for e in h])) == 1


def test_shutdown_cancels_what_is_left(engine_factory):
    engine = engine_factory("fake:delay=20")
    handle = engine.submit(gen(max_new_tokens=200))
    handle.next_event(1)
    engine.shutdown()
    events = [e.to_dict() for e in handle]
    assert events[-1]["type"] == "cancelled" and events[-1]["cause"] == "shutdown"


def test_slow_consumer_is_dropped_with_a_reason(engine_factory):
    engine = engine_factory("fake", event_buffer=8)
    handle = engine.submit(gen(max_new_tokens=200))
    wait_until(lambda: handle.done, "the engine to drop a client that reads nothing", timeout=10, every=0.05)
    events = [e.to_dict() for e in handle]
    assert events[-1]["type"] == "cancelled" and events[-1]["cause"] == "slow_client"
    assert len(events) <= 8 + 1


def test_a_vanishing_temperature_samples_like_greedy_instead_of_failing(fake_engine):
    tiny = run_all(fake_engine, gen(max_new_tokens=200, sampling={"temperature": 1e-300, "seed": 1}), "tiny-t")
    assert tiny[-1]["type"] == "finished" and tiny[-1]["text"] == ANSWER


def test_a_failure_choosing_one_requests_token_ends_that_request_only(engine_factory, monkeypatch):
    import model_runner.local.postprocess as postprocess

    engine = engine_factory("fake:delay=20")
    choose = postprocess.choose

    def failing_choose(logits, sampling, generator):
        if sampling.top_k == 7:  # the marked request
            raise RuntimeError("injected sampling failure")
        return choose(logits, sampling, generator)

    monkeypatch.setattr(postprocess, "choose", failing_choose)
    marked = engine.submit(gen(max_new_tokens=20, sampling={"temperature": 0.5, "top_k": 7}), "marked")
    plain = engine.submit(gen(max_new_tokens=20), "plain")
    marked_end, plain_end = [e.to_dict() for e in marked][-1], [e.to_dict() for e in plain][-1]
    assert (marked_end["type"], marked_end["code"]) == ("error", "internal")
    assert plain_end["type"] == "finished" and plain_end["text"] == ANSWER[:20]
    ok, why = engine.health()
    assert ok, why


def test_chunked_prefill_without_a_kv_cache_is_refused_naming_the_field():
    with pytest.raises(UserError) as info:
        gen(kv_cache=False, prefill_chunk=16)
    assert info.value.field == "prefill_chunk" and "kv_cache" in info.value.message
