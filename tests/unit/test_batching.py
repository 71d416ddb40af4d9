"""Continuous batching on the fake model, as users rely on it: requests share steps, prompts are
chunked between decodes, late arrivals join at the next step (or wait for a static batch), identical
prompt prefixes share KV blocks, a full pool preempts and resumes without changing any answer,
cancels give blocks back at once, and the engine feed shows all of it without ever slowing the
worker. Every claim is read from events, step counts, the feed and engine.snapshot(), never from
timings; each engine is a fresh one (policies change in these tests)."""

from __future__ import annotations

import json
import random
import time

import pytest
from kvscope_testkit import ask as gen
from kvscope_testkit import blocks_mb, events_of, wait_until

from model_runner.loading.fake import ANSWER
from model_runner.local.scheduler import WAIT_STATIC
from model_runner.protocol.errors import UserError
from model_runner.shared.feed import EngineFeed
from model_runner.shared.policy import Policy

TERMINAL = ("finished", "cancelled", "error")
QUESTION = "Tell me about caches."  # with the fake's default system prompt: 76 tokens, 5 blocks of 16
LONG = "Please explain how a paged KV cache shares blocks. " * 3  # 208 tokens: 13 chunks of 16
SHORT_SYSTEM = "s"  # a prompt of 30 tokens + the question's characters
ANSWER_TOKENS = len(ANSWER.encode()) + 1  # one token a byte, then the end-of-turn token


def read_until(handle, predicate, timeout: float = 30.0) -> list[dict]:
    """Read a request's events until one matches (returned last); fails on its end or a timeout."""
    out = []
    while True:
        event = handle.next_event(timeout)
        assert event is not None, f"{handle.id}: nothing matched within {timeout:g} s"
        out.append(event.to_dict())
        if predicate(out[-1]):
            return out
        assert not event.terminal, f"{handle.id} ended first: {out[-1]}"


def subscribe(engine):
    return engine.feed.subscribe(capacity=1_000_000)


def drain(engine, sub) -> list[dict]:
    """The feed's events once the engine is idle, through the last step's `engine_step`."""
    wait_until(lambda: engine.active == 0, "the engine to finish every request")
    last = engine.steps
    out = []
    while not out or not (out[-1]["type"] == "engine_step" and out[-1]["step"] >= last):
        event = sub.next_event(30)
        assert event is not None, f"the feed never published step {last}"
        out.append(event)
    while (event := sub.next_event(0)) is not None:
        out.append(event)
    return out


def steps_of(feed) -> list[dict]:
    return [e for e in feed if e["type"] == "engine_step"]


def rows(step, handle) -> list[dict]:
    """A request's rows in one engine_step's batch."""
    return [r for r in step["batch"] if r["request"] == handle.sequence.key]


def kinds(step, handle) -> set[str]:
    return {r["kind"] for r in rows(step, handle)}


def steps_with(feed, handle) -> list[int]:
    return [s["step"] for s in steps_of(feed) if rows(s, handle)]


def only(events, type_) -> list[dict]:
    return [e for e in events if e["type"] == type_]


def tokens_in_order(events) -> bool:
    return [t["index"] for t in only(events, "token")] == list(range(len(only(events, "token"))))


def used_blocks(engine) -> int:
    return engine.snapshot()["kv"]["used"]


# ---- requests share steps -------------------------------------------------------------------------


def run_four(engine_factory, max_num_seqs):
    engine = engine_factory("fake:delay=5", policy=Policy(max_num_seqs=max_num_seqs))
    handles = [engine.submit(gen(max_new_tokens=10), f"b{i}") for i in range(4)]
    return engine, [events_of(h) for h in handles]


def test_concurrent_requests_share_steps_and_need_far_fewer_of_them(engine_factory):
    serial, serial_events = run_four(engine_factory, 1)
    batched, batched_events = run_four(engine_factory, 16)
    assert serial.steps == 4 * 10  # each: one prefill step, then 9 decode steps, one at a time
    assert batched.steps <= 10 + 3  # together (the others may join a step or so after the first)
    assert {t["batch_size"] for ev in serial_events for t in only(ev, "token")} == {1}
    assert max(t["batch_size"] for ev in batched_events for t in only(ev, "token")) == 4
    for ev in serial_events + batched_events:  # the same greedy answer, batched or not
        assert ev[-1]["type"] == "finished" and ev[-1]["text"] == ANSWER[:10] and tokens_in_order(ev)


def test_a_lone_request_emits_the_same_events_as_before_batching(engine_factory):
    engine = engine_factory("fake")
    events = events_of(engine.submit(gen(max_new_tokens=12), "alone"))
    types = [e["type"] for e in events]
    assert types == ["accepted", "queued", "prefill_start", "prefill_end"] + ["token"] * 12 + ["finished"]
    assert events[2]["chunk_size"] == 0 and events[2]["cached_tokens"] == 0
    assert events[3]["batch_size"] == 1 and all(t["batch_size"] == 1 for t in only(events, "token"))
    assert tokens_in_order(events) and events[-1]["text"] == ANSWER[:12]


# ---- chunked prefill ------------------------------------------------------------------------------


def test_chunked_prefill_interleaves_with_decode_and_keeps_the_text(engine_factory):
    engine = engine_factory("fake", policy=Policy(chunked_prefill=True, chunk_size=16))
    sub = subscribe(engine)
    short = engine.submit(gen("Hi.", max_new_tokens=30), "short")  # 58 tokens: 4 chunks, then decodes
    long = engine.submit(gen(LONG, max_new_tokens=20), "long")
    short_events, long_events = events_of(short), events_of(long)
    feed = drain(engine, sub)
    prompt = long_events[0]["prompt_tokens"]
    assert prompt > 16 * 12 and only(long_events, "prefill_start")[0]["chunk_size"] == 16
    # The chunks cover the prompt exactly, in order, and the cache holds each chunk as it ends.
    chunks = only(long_events, "prefill_chunk")
    assert [(c["start"], c["end"]) for c in chunks] == [(i, min(i + 16, prompt)) for i in range(0, prompt, 16)]
    assert [c["cache_tokens"] for c in chunks] == [c["end"] for c in chunks]
    # The long prompt's chunks ran in the same steps as the short request's decode tokens.
    prefill_rows = [r for s in steps_of(feed) for r in rows(s, long) if r["kind"] == "prefill"]
    assert len(prefill_rows) == len(chunks) and all(r["tokens"] <= 16 for r in prefill_rows)
    mixed = [s for s in steps_of(feed) if "prefill" in kinds(s, long) and "decode" in kinds(s, short)]
    assert len(mixed) >= 6  # unchunked, a prompt shares at most its one step with decodes
    assert all(s["batch_tokens"] <= engine.policy.max_batch_tokens for s in steps_of(feed))
    # The same request unchunked: one prefill step of the whole prompt, and the same text.
    engine.set_policy(chunked_prefill=False)
    again = engine.submit(gen(LONG, max_new_tokens=20), "unchunked")
    again_events = events_of(again)
    feed = drain(engine, sub)
    assert not only(again_events, "prefill_chunk") and only(again_events, "prefill_start")[0]["chunk_size"] == 0
    assert [r["tokens"] for s in steps_of(feed) for r in rows(s, again) if r["kind"] == "prefill"] == [prompt]
    assert long_events[-1]["text"] == again_events[-1]["text"] == ANSWER[:20]
    assert short_events[-1]["text"] == ANSWER[:30] and tokens_in_order(short_events)


# ---- static and continuous admission, policy changes ---------------------------------------------


def late_arrival(engine_factory, batching):
    """A request arriving while another runs: (first's events, late's events, feed, steps at submit)."""
    engine = engine_factory("fake:delay=10", policy=Policy(batching=batching))
    sub = subscribe(engine)
    first = engine.submit(gen(max_new_tokens=25), "first")
    read_until(first, lambda e: e["type"] == "token")
    at_submit = engine.steps
    late = engine.submit(gen(max_new_tokens=5), "late")
    late_events, first_events = events_of(late), events_of(first)
    return first, late, first_events, late_events, drain(engine, sub), at_submit


def test_static_batching_holds_a_late_request_until_the_batch_has_emptied(engine_factory):
    first, late, first_events, late_events, feed, _ = late_arrival(engine_factory, "static")
    assert WAIT_STATIC in [q["reason"] for q in only(late_events, "queued")]
    assert min(steps_with(feed, late)) == max(steps_with(feed, first)) + 1
    types = [(e["type"], e.get("request")) for e in feed]
    assert types.index(("engine_admit", late.sequence.key)) > types.index(("engine_end", first.sequence.key))
    assert first_events[-1]["text"] == ANSWER[:25] and late_events[-1]["text"] == ANSWER[:5]


def test_continuous_batching_admits_a_late_request_at_the_next_step(engine_factory):
    first, late, first_events, late_events, feed, at_submit = late_arrival(engine_factory, "continuous")
    assert WAIT_STATIC not in [q["reason"] for q in only(late_events, "queued")]
    assert min(steps_with(feed, late)) <= at_submit + 2 < max(steps_with(feed, first))
    assert any(rows(s, first) and rows(s, late) for s in steps_of(feed))
    assert max(t["batch_size"] for t in only(late_events, "token")) == 2
    assert first_events[-1]["text"] == ANSWER[:25] and late_events[-1]["text"] == ANSWER[:5]


def test_a_policy_flip_applies_from_the_next_steps(engine_factory):
    engine = engine_factory("fake:delay=10", policy=Policy(batching="static"))
    sub = subscribe(engine)
    first = engine.submit(gen(max_new_tokens=30), "first")
    read_until(first, lambda e: e["type"] == "token")
    late = engine.submit(gen(max_new_tokens=5), "late")
    read_until(late, lambda e: e["type"] == "queued" and e["reason"] == WAIT_STATIC)
    at_flip = engine.steps
    policy = engine.set_policy(batching="continuous")
    assert policy.batching == "continuous" == engine.snapshot()["policy"]["batching"]
    late_events, first_events = events_of(late), events_of(first)
    feed = drain(engine, sub)
    assert min(steps_with(feed, late)) <= at_flip + 2 < max(steps_with(feed, first))
    changes = [e["policy"] for e in feed if e["type"] == "engine_policy"]
    assert changes and changes[0]["batching"] == "continuous"
    assert first_events[-1]["type"] == late_events[-1]["type"] == "finished"


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"batching": "eventually"}, "batching"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"chunk_size": -1}, "chunk_size"),
        ({"prefix_caching": "on"}, "prefix_caching"),
        ({"speed": "fast"}, "speed"),
    ],
)
def test_set_policy_refuses_a_bad_change_naming_the_field(engine_factory, changes, field):
    engine = engine_factory("fake")
    before = engine.policy
    with pytest.raises(UserError) as info:
        engine.set_policy(**changes)
    assert info.value.field == field and field in info.value.message
    assert engine.policy == before


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


# ---- prefix caching -------------------------------------------------------------------------------

SYSTEM = "You are kvscope's patient tutor. Answer in plain words, one idea at a time. " * 2  # ~150 tokens


def two_with_one_system_prompt(engine_factory, prefix_caching):
    engine = engine_factory("fake:delay=5", policy=Policy(prefix_caching=prefix_caching))
    sub = subscribe(engine)
    a = engine.submit(gen("What is a block?", system=SYSTEM, max_new_tokens=30), "a")
    read_until(a, lambda e: e["type"] == "prefill_end")  # its full prompt blocks are in the cache now
    b = engine.submit(gen("And a page?", system=SYSTEM, max_new_tokens=30), "b")
    b_events, a_events = events_of(b), events_of(a)
    return engine, a, b, a_events, b_events, drain(engine, sub)


def test_prefix_caching_shares_the_blocks_of_a_common_system_prompt(engine_factory):
    engine, a, b, a_events, b_events, feed = two_with_one_system_prompt(engine_factory, True)
    cached = only(b_events, "prefill_start")[0]["cached_tokens"]
    assert cached >= 16 * 5 and cached % 16 == 0
    common = next(i for i, (x, y) in enumerate(zip(a.sequence.prompt_ids, b.sequence.prompt_ids)) if x != y)
    assert cached == common // 16 * 16  # every full block of the common prefix, and nothing past it
    assert engine.snapshot()["prefix_hit_tokens"] == cached
    admits = [e for e in feed if e["type"] == "engine_admit" and e["request"] == b.sequence.key]
    assert [e["cached_tokens"] for e in admits] == [cached]
    # b computed only what was not cached, and its prefix blocks were a's, held by both at once.
    prompt = b_events[0]["prompt_tokens"]
    assert [r["tokens"] for s in steps_of(feed) for r in rows(s, b) if r["kind"] == "prefill"] == [prompt - cached]
    both = [s for s in steps_of(feed) if rows(s, a) and rows(s, b)]
    assert both
    shared = set(rows(both[0], b)[0]["shared_blocks"])
    assert len(shared) == cached // 16 and shared <= set(rows(both[0], a)[0]["blocks"])
    # The same greedy text, and every block back in the pool (by reference count) at the end.
    assert a_events[-1]["text"] == b_events[-1]["text"] == ANSWER[:30]
    assert used_blocks(engine) == 0


def test_without_prefix_caching_nothing_is_shared(engine_factory):
    engine, _, _, a_events, b_events, feed = two_with_one_system_prompt(engine_factory, False)
    assert only(b_events, "prefill_start")[0]["cached_tokens"] == 0
    assert not any(r["shared_blocks"] for s in steps_of(feed) for r in s["batch"])
    assert engine.snapshot()["prefix_hit_tokens"] == 0
    assert a_events[-1]["text"] == b_events[-1]["text"] == ANSWER[:30]
    assert used_blocks(engine) == 0


# ---- preemption -----------------------------------------------------------------------------------


def test_an_exhausted_pool_preempts_and_every_answer_still_completes(engine_factory):
    engine = engine_factory("fake", kv_cache_mb=blocks_mb(20))
    assert engine.pool.total_blocks == 20
    sub = subscribe(engine)
    # 31-token prompts: 2 blocks each to start, 8 by the end of the answer; three cannot all finish together.
    handles = [engine.submit(gen("q", system=SHORT_SYSTEM, max_new_tokens=100), f"p{i}") for i in range(3)]
    all_events = [events_of(h) for h in handles]
    feed = drain(engine, sub)
    assert all(ev[0]["prompt_tokens"] == 31 for ev in all_events)
    preempted = [e for ev in all_events for e in only(ev, "preempted")]
    assert preempted and engine.preemptions == len(preempted) == engine.snapshot()["preemptions"]
    assert len([e for e in feed if e["type"] == "engine_preempt"]) == len(preempted)
    assert any(e["resumed"] for e in feed if e["type"] == "engine_admit")
    for ev in all_events:
        types = [e["type"] for e in ev]
        assert types.count("prefill_start") == 1 and types.count("preempted") == types.count("resumed")
        for i, t in enumerate(types):  # no token between a preemption and its resumption
            if t == "preempted":
                assert types[i + 1 :].index("resumed") < [*types[i + 1 :], "token"].index("token")
        for p, r in zip(only(ev, "preempted"), only(ev, "resumed"), strict=True):
            assert p["blocks_freed"] > 0 and r["tokens"] == p["tokens"]  # it recomputes all it had
        assert ev[-1]["type"] == "finished" and ev[-1]["reason"] == "eos" and ev[-1]["text"] == ANSWER
        assert tokens_in_order(ev) and len(only(ev, "token")) == ANSWER_TOKENS
    assert used_blocks(engine) == 0


def test_a_request_that_could_never_fit_the_pool_is_refused_at_submit(engine_factory):
    engine = engine_factory("fake", kv_cache_mb=blocks_mb(20))
    with pytest.raises(UserError) as info:
        engine.submit(gen("q", system=SHORT_SYSTEM, max_new_tokens=300))  # 31 + 300 tokens: 21 blocks
    assert info.value.code == "too_large" and info.value.field == "max_new_tokens"
    assert "max_new_tokens" in info.value.message and "holds 20" in info.value.message
    assert engine.active == 0
    # The same without a KV cache needs no blocks; with a smaller budget it fits the pool.
    uncached = engine.submit(gen("q", system=SHORT_SYSTEM, max_new_tokens=300, kv_cache=False))
    assert events_of(uncached)[-1]["text"] == ANSWER
    assert events_of(engine.submit(gen("q", system=SHORT_SYSTEM, max_new_tokens=100)))[-1]["text"] == ANSWER


# ---- cancels free blocks at once ------------------------------------------------------------------


def cancelled_in(handle, predicate):
    """Read `handle` until `predicate`, then cancel it; its terminal event."""
    read_until(handle, predicate)
    handle.cancel()
    return events_of(handle)[-1]


def test_cancel_while_queued(engine_factory):
    engine = engine_factory("fake:delay=10", policy=Policy(max_num_seqs=1))
    sub = subscribe(engine)
    running = engine.submit(gen(max_new_tokens=60), "running")
    read_until(running, lambda e: e["type"] == "token")
    queued = engine.submit(gen(max_new_tokens=60), "queued")
    end = cancelled_in(queued, lambda e: e["type"] == "queued")
    assert (end["type"], end["state"], end["tokens"]) == ("cancelled", "queued", 0)
    assert engine.pool.blocks_of(queued.sequence) == [] and engine.snapshot()["waiting"] == 0
    running.cancel()
    assert events_of(running)[-1]["state"] == "decode"
    assert used_blocks(engine) == 0
    feed = drain(engine, sub)
    assert [e["blocks_freed"] for e in feed if e["type"] == "engine_end" and e["request"] == queued.sequence.key] == [0]
    assert not steps_with(feed, queued)


def test_cancel_during_chunked_prefill_frees_its_blocks_at_once(engine_factory):
    engine = engine_factory("fake:delay=10", policy=Policy(chunked_prefill=True, chunk_size=16))
    handle = engine.submit(gen(LONG, max_new_tokens=20), "prefill")
    read_until(handle, lambda e: e["type"] == "prefill_chunk")
    assert used_blocks(engine) > 0
    handle.cancel()
    end = events_of(handle)[-1]
    assert (end["type"], end["state"], end["tokens"]) == ("cancelled", "prefill", 0)
    assert used_blocks(engine) == 0  # as soon as the terminal event is out


def test_cancel_during_decode_frees_its_blocks_at_once(engine_factory):
    engine = engine_factory("fake:delay=10")
    handle = engine.submit(gen(max_new_tokens=60), "decode")
    read_until(handle, lambda e: e["type"] == "token" and e["index"] == 3)
    assert used_blocks(engine) >= 5
    handle.cancel()
    end = events_of(handle)[-1]
    assert (end["type"], end["state"]) == ("cancelled", "decode") and end["tokens"] >= 4
    assert used_blocks(engine) == 0


def test_cancel_while_preempted(engine_factory):
    engine = engine_factory("fake:delay=10", kv_cache_mb=blocks_mb(16))
    sub = subscribe(engine)
    handles = [engine.submit(gen(max_new_tokens=100), f"p{i}") for i in range(3)]
    victim = None
    seen = {h.id: [] for h in handles}
    while victim is None:  # follow all three until one is preempted
        for h in handles:
            event = h.next_event(0.01)
            if event is not None:
                seen[h.id].append(event.to_dict())
                assert not event.terminal, f"{h.id} ended before any preemption"
                if event.type == "preempted":
                    victim = h
                    break
    victim.cancel()  # it waits for blocks now (others hold them for many steps)
    end = events_of(victim)[-1]
    assert (end["type"], end["state"]) == ("cancelled", "preempted")
    assert engine.pool.blocks_of(victim.sequence) == []
    for h in handles:
        h.cancel()
    for h in handles:
        if h is not victim:
            assert events_of(h)[-1]["type"] == "cancelled"
    assert used_blocks(engine) == 0
    feed = drain(engine, sub)
    ends = [e for e in feed if e["type"] == "engine_end" and e["request"] == victim.sequence.key]
    assert [e["blocks_freed"] for e in ends] == [0]  # its blocks had gone back when it was preempted
    assert seen[victim.id][-1]["blocks_freed"] > 0


# ---- many requests: exactly one terminal event each ----------------------------------------------


def test_exactly_one_terminal_event_each_under_random_submits_and_cancels(engine_factory):
    rng = random.Random(20240611)
    engine = engine_factory("fake", kv_cache_mb=blocks_mb(16), max_queue=256, policy=Policy(max_num_seqs=8))
    handles, plans = [], []
    for i in range(200):
        # "ab" makes a 32-token prompt that fills two blocks exactly: its first decode needs a third.
        content = rng.choice(["ab", "cd", "q" * rng.randint(1, 60)])
        fields = {"max_new_tokens": rng.randint(1, 5)}
        if rng.random() < 0.15:
            fields["kv_cache"] = False
        elif rng.random() < 0.2:  # chunks need the cache
            fields["prefill_chunk"] = rng.choice([8, 16])
        handles.append(engine.submit(gen(content, system=SHORT_SYSTEM, **fields), f"s{i}"))
        plans.append(fields)
        luck = rng.random()
        if luck < 0.1:  # cancel what was just submitted
            handles[-1].cancel()
        elif luck < 0.3:  # cancel one that has started (prefill, decode, preempted), if any
            started = [h for h in handles if h.sequence.state.value in ("prefill", "decode", "preempted")]
            if started:
                rng.choice(started).cancel()
        if rng.random() < 0.5:  # let the engine take a step before the next arrival
            at = engine.steps
            wait_until(lambda at=at: engine.steps > at or engine.active == 0, "the engine to take a step", every=0.001)
    outcomes: dict[str, int] = {}
    for h, fields in zip(handles, plans, strict=True):
        events = events_of(h)
        end = events[-1]
        assert [e["type"] for e in events if e["type"] in TERMINAL] == [end["type"]] and h.next_event(0) is None
        key = end["type"] if end["type"] == "finished" else f"cancelled while {end['state']}"
        outcomes[key] = outcomes.get(key, 0) + 1
        if end["type"] == "finished":
            assert end["text"] == ANSWER[: fields["max_new_tokens"]] and end["tokens"] == fields["max_new_tokens"]
            assert tokens_in_order(events)
        else:
            assert end["type"] == "cancelled" and end["state"] in ("queued", "prefill", "decode", "preempted")
    assert sum(outcomes.values()) == 200 and "finished" in outcomes and len(outcomes) >= 3, outcomes
    wait_until(lambda: engine.active == 0, "the engine to go idle")
    snap = engine.snapshot()
    assert snap["kv"]["used"] == snap["waiting"] == snap["running"] == 0
    assert engine.preemptions > 0


# ---- the engine feed ------------------------------------------------------------------------------

SECRET = "Tell me the zebra password, please."


def test_a_subscriber_that_never_reads_does_not_stop_the_engine(engine_factory):
    engine = engine_factory("fake")
    deaf = engine.feed.subscribe(capacity=4)
    reader = subscribe(engine)
    events = events_of(engine.submit(gen(SECRET, max_new_tokens=30), "f", label="lab 1"))
    assert events[-1]["type"] == "finished" and events[-1]["text"] == ANSWER[:30]
    feed = drain(engine, reader)
    assert deaf.dropped == len(feed) - 4 > 0
    # It kept the first four; the first event it is offered after the gap says how many it lost.
    assert all("dropped" not in deaf.next_event(0) for _ in range(4)) and deaf.next_event(0) is None
    engine.set_policy(max_num_seqs=8)  # publishes one more event
    assert deaf.next_event(5)["dropped"] == deaf.dropped
    assert "dropped" not in json.dumps(feed)
    deaf.close()
    reader.close()
    assert engine.feed.subscribers == 0


def test_a_reading_subscriber_sees_admission_steps_and_the_end(engine_factory):
    engine = engine_factory("fake")
    sub = subscribe(engine)
    handle = engine.submit(gen(SECRET, max_new_tokens=30), "f", label="lab 1")
    events_of(handle)
    feed = drain(engine, sub)
    key = handle.sequence.key
    mine = [e for e in feed if e.get("request") == key or any(r["request"] == key for r in e.get("batch", ()))]
    expected = ["engine_submit", "engine_admit"] + ["engine_step"] * 29 + ["engine_end"] + ["engine_step"]
    assert [e["type"] for e in mine] == expected
    submitted, admit, end = mine[0], mine[1], mine[-2]
    assert submitted["label"] == admit["label"] == end["label"] == "lab 1" and admit["resumed"] is False
    assert submitted["prompt_tokens"] == admit["prompt_tokens"] == 55 + len(SECRET)
    assert (end["outcome"], end["reason"], end["tokens"]) == ("finished", "max_tokens", 30)
    assert end["blocks_freed"] == len(rows(mine[-3], handle)[0]["blocks"]) > 0  # what it held in its last steps
    assert [rows(s, handle)[0]["kind"] for s in steps_of(mine)] == ["prefill"] + ["decode"] * 29
    assert [s["step"] for s in steps_of(feed)] == list(range(1, engine.steps + 1))


def test_the_feed_carries_no_prompt_or_answer_text_by_default(engine_factory):
    engine = engine_factory("fake")
    sub = subscribe(engine)
    events_of(engine.submit(gen(SECRET, max_new_tokens=30), "f"))
    for event in drain(engine, sub):
        text = json.dumps(event, ensure_ascii=False)
        assert "zebra" not in text and ANSWER[:20] not in text, event


def test_feed_text_lets_the_feed_carry_the_prompt_and_answer(engine_factory):
    engine = engine_factory("fake", feed_text=True)
    sub = subscribe(engine)
    events_of(engine.submit(gen(SECRET, max_new_tokens=30), "f"))
    feed = drain(engine, sub)
    assert [e["prompt"] for e in feed if e["type"] == "engine_admit"] == [SECRET]
    assert [e["text"] for e in feed if e["type"] == "engine_end"] == [ANSWER[:30]]


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


# ---- requests without a KV cache ------------------------------------------------------------------


def test_a_request_without_kv_cache_runs_in_the_same_steps_as_cached_ones(engine_factory):
    engine = engine_factory("fake")
    sub = subscribe(engine)
    cached = engine.submit(gen(max_new_tokens=30), "cached")
    uncached = engine.submit(gen(max_new_tokens=30, kv_cache=False), "uncached")
    cached_events, uncached_events = events_of(cached), events_of(uncached)
    feed = drain(engine, sub)
    together = [s for s in steps_of(feed) if "recompute" in kinds(s, uncached) and "decode" in kinds(s, cached)]
    assert len(together) >= 20
    assert all(r["blocks"] == [] for s in steps_of(feed) for r in rows(s, uncached))
    assert max(t["batch_size"] for t in only(uncached_events, "token")) == 2
    assert all(t["cache_tokens"] == 0 for t in only(uncached_events, "token"))
    assert cached_events[-1]["text"] == uncached_events[-1]["text"] == ANSWER[:30]
    assert used_blocks(engine) == 0


def test_an_experiment_s_hold_neither_undoes_nor_is_undone_by_the_teacher_s_pause(engine_factory):
    engine = engine_factory("fake")
    engine.set_paused(True)
    with engine.admissions_held():
        engine.set_paused(False)  # the teacher resumes while an experiment queues its batch
        handle = engine.submit(gen("held", max_new_tokens=2), "h")
        time.sleep(0.2)
        assert handle.sequence.state.value == "queued"  # still held by the experiment
    assert engine.paused is False
    assert events_of(handle)[-1]["type"] == "finished"  # admitted once the hold ends
    engine.set_paused(True)
    with engine.admissions_held():
        pass
    assert engine.paused is True  # the hold's end does not resume a paused class
    engine.set_paused(False)
