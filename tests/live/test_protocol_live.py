"""The WebSocket protocol (docs/protocol.md) against a live gunicorn server and a real WebSocket
client: full generate, cancel, several requests per socket, every validation case, the limits,
the Origin/Host defences, and sockets that close or reset mid-stream."""

from __future__ import annotations

import json
import urllib.request

import pytest
from kvscope_testkit import HELLO, TERMINAL, LogCursor, RawClient, browser_headers, end_is, generate_frame
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from model_runner.loading.fake import ANSWER

WAIT_S = 60.0  # deadline for conditions that hold in well under a second; never a timing claim


@pytest.fixture
def capped_server(live_server):
    """The fake model at 40 ms per step (a request decodes for seconds), one request at a time (so
    the next ones wait, as they do whenever the batch is full) and a queue cap of 4."""
    return live_server("fake:delay=40", env={"KVSCOPE_MAX_QUEUE": "4", "KVSCOPE_POLICY": '{"max_num_seqs": 1}'})


def open_ws(server, **kwargs):
    return connect(server.ws_url, origin=server.url, open_timeout=WAIT_S, close_timeout=5, **kwargs)


def generate(rid, **fields) -> str:
    return json.dumps(generate_frame(rid, **fields))


def receive(ws) -> dict:
    return json.loads(ws.recv(timeout=WAIT_S))


def run_to_end(ws, rid) -> list[dict]:
    """This request's events, up to and including its terminal event."""
    events = []
    while not events or events[-1]["type"] not in TERMINAL:
        event = receive(ws)
        if event["request_id"] == rid:
            events.append(event)
    return events


def until(ws, predicate) -> dict:
    while True:
        event = receive(ws)
        if predicate(event):
            return event


# ---- the happy paths -----------------------------------------------------------------------------


def test_a_full_generate_streams_every_stage_to_finished(fake_server):
    with open_ws(fake_server) as ws:
        ws.send(generate("full-1", max_new_tokens=400))
        events = run_to_end(ws, "full-1")
    kinds = [e["type"] for e in events]
    assert kinds[0] == "accepted" and kinds[-1] == "finished"
    assert kinds.index("prefill_start") < kinds.index("prefill_end") < kinds.index("token")
    assert all(e["request_id"] == "full-1" and e["schema"] == 1 for e in events)
    tokens = [e for e in events if e["type"] == "token"]
    assert [t["index"] for t in tokens] == list(range(len(tokens)))
    assert "".join(t["text"] for t in tokens) == events[-1]["text"] == ANSWER
    assert events[-1]["reason"] == "eos"


def test_several_requests_share_one_socket_in_turn_and_at_once(fake_server):
    with open_ws(fake_server) as ws:
        for rid in ("seq-1", "seq-2"):
            ws.send(generate(rid, max_new_tokens=4))
            assert run_to_end(ws, rid)[-1]["text"] == ANSWER[:4]
        ws.send(generate("par-1", max_new_tokens=3))
        ws.send(generate("par-2", max_new_tokens=5, delivery="buffered"))
        ends = {}
        while len(ends) < 2:
            event = receive(ws)
            assert event["request_id"] in ("par-1", "par-2")
            if event["type"] == "token" and event["request_id"] == "par-2":
                assert event["text"] == "", "buffered delivery sends text only at the end"
            if event["type"] in TERMINAL:
                ends[event["request_id"]] = event
    assert ends["par-1"]["text"] == ANSWER[:3] and ends["par-2"]["text"] == ANSWER[:5]


def test_cancel_ends_a_decoding_request_with_its_partial_answer(capped_server):
    with open_ws(capped_server) as ws:
        ws.send(generate("cancel-1", max_new_tokens=400))
        until(ws, lambda e: e["type"] == "token")
        ws.send(json.dumps({"type": "cancel", "request_id": "cancel-1"}))
        end = until(ws, lambda e: e["type"] in TERMINAL)
    assert (end["type"], end["cause"], end["state"]) == ("cancelled", "client", "decode")
    assert ANSWER.startswith(end["text"]) and len(end["text"]) < len(ANSWER)


# ---- validation: an error naming the field and the limit, and the socket stays usable ---------

GOOD = {"type": "generate", "request_id": "v", "messages": HELLO}
CASES = {
    "malformed JSON": ('{"type": "generate", ', None, "invalid_json", None, "not valid JSON"),
    "binary frame": (b'{"type": "generate"}', None, "invalid_json", None, "binary"),
    "JSON that is not an object": ("[1, 2, 3]", None, "invalid_json", None, "JSON object"),
    "unknown type": (
        {"type": "summon", "request_id": "v"},
        None,
        "invalid_request",
        "type",
        "'generate', 'cancel', 'subscribe' or 'unsubscribe'",
    ),
    "missing type": ({"request_id": "v", "messages": HELLO}, None, "invalid_request", "type", "got None"),
    "missing request_id": ({"type": "generate", "messages": HELLO}, None, "invalid_request", "request_id", "1 to 64"),
    "wrong-typed request_id": ({**GOOD, "request_id": 12}, None, "invalid_request", "request_id", "got 12"),
    "missing messages": ({"type": "generate", "request_id": "v"}, "v", "invalid_request", "messages", "non-empty list"),
    "wrong-typed messages": ({**GOOD, "messages": "hello"}, "v", "invalid_request", "messages", "non-empty list"),
    "empty messages": ({**GOOD, "messages": []}, "v", "invalid_request", "messages", "non-empty list"),
    "unknown role": (
        {**GOOD, "messages": [{"role": "wizard", "content": "hi"}]},
        "v",
        "invalid_request",
        "messages[0].role",
        "system, user, assistant, retrieved",
    ),
    "wrong-typed content": (
        {**GOOD, "messages": [{"role": "user", "content": 5}]},
        "v",
        "invalid_request",
        "messages[0].content",
        "must be a string",
    ),
    "empty last user message": (
        {**GOOD, "messages": [{"role": "user", "content": "  "}]},
        "v",
        "invalid_request",
        "messages[0]",
        "non-empty `user` message",
    ),
    "max_new_tokens 0": (
        {**GOOD, "max_new_tokens": 0},
        "v",
        "invalid_request",
        "max_new_tokens",
        "`max_new_tokens` must be an integer between 1 and 1024, got 0",
    ),
    "max_new_tokens as text": ({**GOOD, "max_new_tokens": "ten"}, "v", "invalid_request", "max_new_tokens", "integer"),
    "NaN temperature": (
        '{"type": "generate", "request_id": "v", "messages": [{"role": "user", "content": "hi"}], '
        '"sampling": {"temperature": NaN}}',
        "v",
        "invalid_request",
        "sampling.temperature",
        "between 0 and 2",
    ),
    "negative temperature": (
        {**GOOD, "sampling": {"temperature": -0.5}},
        "v",
        "invalid_request",
        "sampling.temperature",
        "between 0 and 2, got -0.5",
    ),
    "top_p 0": ({**GOOD, "sampling": {"top_p": 0}}, "v", "invalid_request", "sampling.top_p", "(0, 1]"),
    "top_p above 1": (
        {**GOOD, "sampling": {"top_p": 1.5}},
        "v",
        "invalid_request",
        "sampling.top_p",
        "(0, 1], got 1.5",
    ),
    "top_k 0": (
        {**GOOD, "sampling": {"top_k": 0}},
        "v",
        "invalid_request",
        "sampling.top_k",
        "between 1 and 1000, got 0",
    ),
    "too many stop strings": ({**GOOD, "stop": ["a", "b", "c", "d", "e"]}, "v", "invalid_request", "stop", "at most 4"),
    "too long stop string": (
        {**GOOD, "stop": ["x" * 65]},
        "v",
        "invalid_request",
        "stop",
        "1 to 64 characters, got 65",
    ),
    "unknown delivery": ({**GOOD, "delivery": "pigeon"}, "v", "invalid_request", "delivery", "'stream', 'buffered'"),
    "wrong-typed kv_cache": ({**GOOD, "kv_cache": "yes"}, "v", "invalid_request", "kv_cache", "true or false"),
    "negative prefill_chunk": (
        {**GOOD, "prefill_chunk": -1},
        "v",
        "invalid_request",
        "prefill_chunk",
        "between 0 and 8192",
    ),
    "unknown overflow policy": ({**GOOD, "overflow": "ignore"}, "v", "invalid_request", "overflow", "'reject'"),
    "timeout_s 0": ({**GOOD, "timeout_s": 0}, "v", "invalid_request", "timeout_s", "(0, 300]"),
    "prompt past the context window": (
        {**GOOD, "messages": [{"role": "user", "content": "word " * 120}]},
        "v",
        "context_overflow",
        "max_new_tokens",
        "512",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_invalid_frame_gets_an_error_naming_field_and_limit_and_the_socket_lives(fake_server, case):
    frame, rid, code, field, says = CASES[case]
    with open_ws(fake_server) as ws:
        ws.send(frame if isinstance(frame, (str, bytes)) else json.dumps(frame))
        error = receive(ws)
        assert (error["type"], error["request_id"], error["code"], error["field"]) == ("error", rid, code, field)
        assert says in error["message"]
        ws.send(generate("after", max_new_tokens=2))
        assert run_to_end(ws, "after")[-1]["type"] == "finished"


def test_a_frame_over_the_size_limit_closes_the_socket_with_1009(fake_server):
    with open_ws(fake_server) as ws:
        ws.send(generate("huge", messages=[{"role": "user", "content": "x" * 300_000}]))
        with pytest.raises(ConnectionClosed) as info:
            receive(ws)
    assert info.value.rcvd is not None and info.value.rcvd.code == 1009


def test_requests_in_flight_per_socket_and_the_queue_are_capped_with_immediate_errors(capped_server):
    """Per socket: 4 in flight, the fifth is `too_many_requests`. Server-wide: the queue holds 4
    waiting requests; past that a request is `overloaded` at once, with nothing queued."""
    with open_ws(capped_server) as first, open_ws(capped_server) as second:
        for n in range(5):
            first.send(generate(f"cap-{n}", max_new_tokens=400))
        refused = until(first, lambda e: e["type"] == "error")
        assert (refused["request_id"], refused["code"]) == ("cap-4", "too_many_requests")
        for n in range(4):
            second.send(generate(f"over-{n}", max_new_tokens=400))
        answers = {}
        while len(answers) < 4:
            event = receive(second)
            answers.setdefault(event["request_id"], event)
        overloaded = [rid for rid, e in answers.items() if e["type"] == "error"]
        assert overloaded and all(answers[rid]["code"] == "overloaded" for rid in overloaded)
        assert all(answers[rid]["type"] == "accepted" for rid in answers.keys() - set(overloaded))


# ---- closing mid-stream -----------------------------------------------------------------------


def raw_ws(server) -> RawClient:
    """A WebSocket on a plain socket, so the test alone decides how the TCP connection ends."""
    raw = RawClient(server.port, browser_headers(server))
    assert raw.status == 101, raw.response_headers
    return raw


def assert_served_normally(server) -> None:
    with open_ws(server) as ws:
        ws.send(generate("next", max_new_tokens=3))
        assert run_to_end(ws, "next")[-1]["type"] == "finished"


def close_after_first_token(server, rid: str) -> None:
    """Leave mid-answer with a clean WebSocket close."""
    with open_ws(server) as ws:
        ws.send(generate(rid, max_new_tokens=400))
        until(ws, lambda e: e["type"] == "token")


def reset_after_first_token(server, rid: str) -> None:
    """Leave mid-answer with a TCP reset (linger 0: the kernel sends RST, not FIN)."""
    raw = raw_ws(server)
    raw.send_text(generate(rid, max_new_tokens=400))
    raw.read_until("token")
    raw.reset()


@pytest.mark.parametrize("leave", [close_after_first_token, reset_after_first_token], ids=["close", "tcp-reset"])
def test_leaving_mid_stream_cancels_the_request_quietly_and_the_server_carries_on(capped_server, leave):
    log = LogCursor(capped_server)
    leave(capped_server, "left-1")
    end = log.wait_end("left-1")
    assert end_is(end, "cancelled", cause="disconnect", state="decode"), end
    assert_served_normally(capped_server)
    assert log.tracebacks() == []


def test_a_reset_while_queued_drops_the_request_without_prefill(capped_server):
    log = LogCursor(capped_server)
    with open_ws(capped_server) as holder:
        holder.send(generate("holder", max_new_tokens=400))
        until(holder, lambda e: e["type"] == "token")
        raw = raw_ws(capped_server)
        raw.send_text(generate("queued-1", max_new_tokens=400))
        raw.read_until("queued")
        raw.reset()
        end = log.wait_end("queued-1")
    assert end_is(end, "cancelled", cause="disconnect", state="queued", tokens=0), end
    assert log.tracebacks() == []


# ---- who may connect -----------------------------------------------------------------------------


@pytest.mark.parametrize("origin", [None, "http://evil.example", "null", "http://127.0.0.1:1"])
def test_a_foreign_or_missing_origin_is_refused_with_403_before_any_model_work(fake_server, origin):
    log = LogCursor(fake_server)
    with pytest.raises(InvalidStatus) as info:
        connect(fake_server.ws_url, origin=origin, open_timeout=WAIT_S)
    assert info.value.response.status_code == 403
    assert log.ended() == {} and log.events("request_refused") == [], "no frame may have reached the session"


def test_a_rebinding_host_name_is_refused(fake_server):
    request = urllib.request.Request(
        fake_server.url + "/api/model", headers={"Host": f"evil.example:{fake_server.port}"}
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=WAIT_S)
    assert info.value.code == 403
    evil = f"evil.example:{fake_server.port}"
    raw = RawClient(fake_server.port, browser_headers(fake_server, host=evil))  # its own origin: only Host can catch it
    raw.close()
    assert raw.status == 403, raw.response_headers


def test_http_api_answers_over_the_live_server(fake_server):
    with urllib.request.urlopen(fake_server.url + "/api/model", timeout=WAIT_S) as r:
        assert json.load(r)["facts"]["context_window"] == 512
        assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
    body = json.dumps({"messages": HELLO}).encode()
    request = urllib.request.Request(
        fake_server.url + "/api/prompt",
        data=body,
        headers={"Content-Type": "application/json", "Origin": fake_server.url},
    )
    with urllib.request.urlopen(request, timeout=WAIT_S) as r:
        assert json.load(r)["counts"]["content"] > 0
    with urllib.request.urlopen(fake_server.url + "/healthz", timeout=WAIT_S) as r:
        assert r.status == 200
