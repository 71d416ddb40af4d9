"""Cases 8, 10, 11, 13 and 14: clients that leave, lag or crowd in. Whatever they do, the model
stops working for them at once, never works for a request nobody waits for, and keeps serving
everyone else; a full queue says so immediately."""

from __future__ import annotations

import json
import time

from kvscope_testkit import (
    ONE_AT_A_TIME,
    PING_INTERVAL_S,
    WAIT_S,
    Client,
    LogCursor,
    RawClient,
    browser_headers,
    close_code,
    end_is,
    generate_frame,
    server_holds_connection,
    slow_server_env,
    terminals,
    wait_until,
)

from model_runner.protocol.request import parse_generate

FULL_ANSWER_TOKENS = 91  # the fake model's whole answer, eos included
LONG_PROMPT = [{"role": "user", "content": "long " * 60}]  # ~365 tokens: with prefill_chunk=1, as many steps


def tokens_of(events: list[dict]) -> int:
    return sum(e["type"] == "token" for e in events)


def short_run(server, rid: str) -> dict:
    """A 3-token request on a fresh socket: its `queued` event and its metrics."""
    client = Client(server)
    events = client.run(rid, max_new_tokens=3)
    client.close()
    end = terminals(events)[0]
    assert end["type"] == "finished", end
    queued = next(e for e in events if e["type"] == "queued")
    return {"position": queued["position"], "ahead": queued["ahead"], "ttft_ms": end["metrics"]["ttft_ms"]}


def test_08_closing_mid_stream_stops_the_worker_within_one_step_and_the_next_ttft_is_normal(
    slow_server, engine_factory, monkeypatch, figures
):
    # In process: count the model's steps that start after the cancel (whichever decoder runs them).
    engine = engine_factory("fake:delay=5")
    calls = []
    decoder = engine._forward.decoder
    run = decoder.run
    monkeypatch.setattr(decoder, "run", lambda step: calls.append(1) or run(step))
    handle = engine.submit(parse_generate(generate_frame(None, max_new_tokens=400)), "inproc")
    seen = 0
    while seen < 5:
        seen += handle.next_event(WAIT_S).type == "token"
    handle.cancel(cause="disconnect")
    at_cancel = len(calls)
    end = [e for e in handle][-1].to_dict()
    assert (end["type"], end["cause"], end["state"]) == ("cancelled", "disconnect", "decode")
    assert len(calls) - at_cancel <= 1, "at most the step already under way may run after the cancel"

    # Live: a browser-like client closes its socket mid-answer.
    log = LogCursor(slow_server)
    before = short_run(slow_server, "before")
    leaving = Client(slow_server)
    leaving.generate("leaving", max_new_tokens=400)
    received = tokens_of(leaving.wait("leaving", lambda evs: tokens_of(evs) >= 5))
    leaving.close()
    how = log.wait_end("leaving")
    assert end_is(how, "cancelled", cause="disconnect", state="decode"), how
    generated = how["tokens"]
    assert received <= generated < FULL_ANSWER_TOKENS
    after = short_run(slow_server, "after")
    assert (after["position"], after["ahead"]) == (1, 0), "nothing may still run for the client that left"
    figures["08"] = {
        "forward_passes_after_cancel": len(calls) - at_cancel,
        "tokens_received_before_close": received,
        "tokens_generated_at_cancel": generated,
        "ttft_ms_before": before["ttft_ms"],
        "ttft_ms_after": after["ttft_ms"],
    }


def test_10_a_client_that_leaves_while_queued_is_never_prefilled(slow_server, figures):
    log = LogCursor(slow_server)
    runner = Client(slow_server)
    runner.generate("running", messages=LONG_PROMPT, prefill_chunk=1, max_new_tokens=8)  # busy for ~10 s or more
    runner.wait_type("running", "prefill_start")
    waiter = Client(slow_server)
    waiter.generate("waiting", max_new_tokens=400)
    queued = waiter.wait_type("waiting", "queued")
    assert (queued["position"], queued["ahead"]) == (1, 1)
    waiter.close()
    how = log.wait_end("waiting")
    assert end_is(how, "cancelled", cause="disconnect", state="queued", tokens=0), how
    runner.cancel("running")
    end = terminals(runner.wait("running"))[0]
    assert (end["type"], end["cause"], end["state"]) == ("cancelled", "client", "prefill"), (
        "the runner ran on, undisturbed"
    )
    runner.close()
    figures["10"] = {"left_while": "queued (position 1, 1 ahead)", "ended": how}


def test_11_a_client_that_stops_reading_is_dropped_as_slow_and_others_are_served(slow_server, engine_factory, figures):
    # In process: a consumer that never reads fills its bounded buffer and is dropped as slow,
    # while a request behind it completes; its terminal event still gets through.
    engine = engine_factory("fake", event_buffer=8)
    stuck = engine.submit(parse_generate(generate_frame(None, max_new_tokens=400)), "stuck")
    served = [e.to_dict() for e in engine.submit(parse_generate(generate_frame(None, max_new_tokens=400)), "served")]
    assert served[-1]["type"] == "finished" and served[-1]["reason"] == "eos"
    stuck_events = [e.to_dict() for e in stuck]
    assert len(stuck_events) <= 8 + 1
    end = stuck_events[-1]
    assert (end["type"], end["cause"]) == ("cancelled", "slow_client")

    # Live: a client with a tiny receive window sends a request and, once it has started, never reads
    # again (nor answers pings). Others are served meanwhile; its request ends once; it is let go.
    log = LogCursor(slow_server)
    slow = RawClient(slow_server.port, browser_headers(slow_server), rcvbuf=2048)
    slow.send_text(json.dumps(generate_frame("never-read", max_new_tokens=40)))
    slow.read_until("prefill_start")  # read only until the model has started on it, then never again
    other = Client(slow_server)
    other.generate("other", max_new_tokens=3)
    queued = other.wait_type("other", "queued")
    assert (queued["position"], queued["ahead"]) == (1, 1), "the other request waited behind the stuck one"
    assert terminals(other.wait("other"))[0]["type"] == "finished", "the client behind it was served"
    other.close()
    how = log.wait_end("never-read")
    assert (
        end_is(how, "finished", reason="max_tokens", tokens=40)
        or end_is(how, "cancelled", cause="slow_client")
        or end_is(how, "cancelled", cause="disconnect")
    ), how
    wait_until(
        lambda: not server_holds_connection(slow_server, slow.local_port),
        "the server to let the client go",
        timeout=WAIT_S + 4 * PING_INTERVAL_S,
    )
    frames, closed = slow.read_frames(5)
    slow.close()
    assert closed
    figures["11"] = {
        "in_process_buffer_events": 8,
        "in_process_stuck_events": len(stuck_events),
        "live_non_reader": how,
        "live_close_code": close_code(frames),
        "others": "finished",
    }


def test_13_two_hundred_abandoned_requests_leave_the_server_ready_at_once(slow_server, figures):
    total, sockets_per_wave, per_socket = 200, 16, 4  # a wave fills the queue (cap 64) without overflowing it
    log = LogCursor(slow_server)
    before = short_run(slow_server, "before-200")
    started = time.monotonic()
    sent, first = [], {}
    while len(sent) < total:
        wave = [Client(slow_server) for _ in range(min(sockets_per_wave, -(-(total - len(sent)) // per_socket)))]
        rids = []
        for c in wave:
            for _ in range(min(per_socket, total - len(sent) - len(rids))):
                rid = f"abandon-{len(sent) + len(rids)}"
                c.generate(rid, messages=LONG_PROMPT, prefill_chunk=1, max_new_tokens=100)  # long: none can finish
                rids.append((c, rid))
        for c, rid in rids:
            first[rid] = c.wait(rid, lambda evs: bool(evs))[0]["type"]
        for c in wave:  # abandon: the tabs go away without a word
            c.drop()
        log.wait_ended([rid for _, rid in rids])
        sent += [rid for _, rid in rids]
    abandoned_s = time.monotonic() - started
    after = short_run(slow_server, "after-200")
    ended = log.wait_ended(sent)
    assert set(first.values()) == {"accepted"}
    assert all(end_is(how, "cancelled", cause="disconnect") for how in ended.values())
    never_started = sum(end_is(how, "cancelled", state="queued", tokens=0) for how in ended.values())
    assert (after["position"], after["ahead"]) == (1, 0)
    figures["13"] = {
        "abandoned": total,
        "never_prefilled": never_started,
        "seconds_to_send_and_abandon": round(abandoned_s, 1),
        "fresh_ttft_ms_before": before["ttft_ms"],
        "fresh_ttft_ms_after": after["ttft_ms"],
    }


def test_14_more_requests_than_the_queue_cap_get_overloaded_at_once(live_server, figures):
    # One request at a time, so the queue fills as it does whenever the batch is full.
    slow_server = live_server("fake:delay=30", env=slow_server_env(KVSCOPE_POLICY=ONE_AT_A_TIME))
    cap, per_socket, sockets = 64, 4, 17  # 68 requests: one runs, 64 wait, the rest are refused
    log = LogCursor(slow_server)
    # The first request reads its prompt one token per step, so it is still running at the end.
    clients = [Client(slow_server) for _ in range(sockets)]
    clients[0].generate("q-0", messages=LONG_PROMPT, prefill_chunk=1, max_new_tokens=8)
    clients[0].wait_type("q-0", "prefill_start")
    sent_at = {}
    for i in range(1, sockets * per_socket):
        rid = f"q-{i}"
        clients[i // per_socket].generate(rid, max_new_tokens=400)
        sent_at[rid] = time.monotonic()
    firsts = {}
    for i in range(1, sockets * per_socket):
        c, rid = clients[i // per_socket], f"q-{i}"
        event = c.wait(rid, lambda evs: bool(evs))[0]
        firsts[rid] = (event, c.received_at[rid][0] - sent_at[rid])
    overloaded = {rid: e for rid, (e, _) in firsts.items() if e["type"] == "error"}
    assert len(overloaded) == sockets * per_socket - 1 - cap
    assert all(e["code"] == "overloaded" and f"queue cap {cap}" in e["message"] for e in overloaded.values())
    assert terminals(clients[0].events["q-0"]) == [], "the refusals came while the first request still ran"
    assert all(len(clients[int(rid[2:]) // per_socket].events[rid]) == 1 for rid in overloaded)
    for c in clients:
        c.drop()
    accepted = [rid for rid, (e, _) in firsts.items() if e["type"] == "accepted"] + ["q-0"]
    log.wait_ended(accepted)
    waits = sorted(ms for rid, (_, ms) in firsts.items() if rid in overloaded)
    figures["14"] = {
        "sent": sockets * per_socket,
        "queue_cap": cap,
        "overloaded": len(overloaded),
        "slowest_overloaded_answer_ms": round(waits[-1] * 1000, 1),
    }
