"""The WebSocket protocol (docs/protocol.md) against a live gunicorn server and a real WebSocket
client: full generate, cancel, several requests per socket, every validation case, the limits,
the Origin/Host defences, and sockets that close or reset mid-stream."""
from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time
import urllib.request

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from kvscope_testkit import LiveServer
from model_runner.fake import ANSWER

WAIT_S = 60.0  # deadline for conditions that hold in well under a second; never a timing claim
TERMINAL = {"finished", "cancelled", "error"}
HI = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def slow_server():
    """The fake model at 40 ms per step (a request decodes for seconds) and a queue cap of 4."""
    server = LiveServer("fake:delay=40", extra_env={"KVSCOPE_MAX_QUEUE": "4"})
    try:
        server.wait_ready(120)
        yield server
    finally:
        server.stop()


def open_ws(server, **kwargs):
    return connect(server.ws_url, origin=server.url, open_timeout=WAIT_S, close_timeout=5, **kwargs)


def generate(rid, **fields) -> str:
    return json.dumps({"type": "generate", "request_id": rid, "messages": HI, **fields})


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


def wait_for_log(server, start: int, text: str) -> str:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        tail = server.log()[start:]
        if text in tail:
            return tail
        time.sleep(0.05)
    raise AssertionError(f"{text!r} never appeared in the server log:\n{server.log()[start:][-2000:]}")


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


def test_cancel_ends_a_decoding_request_with_its_partial_answer(slow_server):
    with open_ws(slow_server) as ws:
        ws.send(generate("cancel-1", max_new_tokens=400))
        until(ws, lambda e: e["type"] == "token")
        ws.send(json.dumps({"type": "cancel", "request_id": "cancel-1"}))
        end = until(ws, lambda e: e["type"] in TERMINAL)
    assert (end["type"], end["cause"], end["state"]) == ("cancelled", "client", "decode")
    assert ANSWER.startswith(end["text"]) and len(end["text"]) < len(ANSWER)


# ---- validation: an error naming the field and the limit, and the socket stays usable ---------

GOOD = {"type": "generate", "request_id": "v", "messages": HI}
CASES = {
    "malformed JSON": ('{"type": "generate", ', None, "invalid_json", None, "not valid JSON"),
    "binary frame": (b'{"type": "generate"}', None, "invalid_json", None, "binary"),
    "JSON that is not an object": ("[1, 2, 3]", None, "invalid_json", None, "JSON object"),
    "unknown type": ({"type": "summon", "request_id": "v"}, None, "invalid_request", "type", "'generate' or 'cancel'"),
    "missing type": ({"request_id": "v", "messages": HI}, None, "invalid_request", "type", "got None"),
    "missing request_id": ({"type": "generate", "messages": HI}, None, "invalid_request", "request_id", "1 to 64"),
    "wrong-typed request_id": ({**GOOD, "request_id": 12}, None, "invalid_request", "request_id", "got 12"),
    "missing messages": ({"type": "generate", "request_id": "v"}, "v", "invalid_request", "messages", "non-empty list"),
    "wrong-typed messages": ({**GOOD, "messages": "hello"}, "v", "invalid_request", "messages", "non-empty list"),
    "empty messages": ({**GOOD, "messages": []}, "v", "invalid_request", "messages", "non-empty list"),
    "unknown role": ({**GOOD, "messages": [{"role": "wizard", "content": "hi"}]}, "v", "invalid_request",
                     "messages[0].role", "system, user, assistant, retrieved"),
    "wrong-typed content": ({**GOOD, "messages": [{"role": "user", "content": 5}]}, "v", "invalid_request",
                            "messages[0].content", "must be a string"),
    "empty last user message": ({**GOOD, "messages": [{"role": "user", "content": "  "}]}, "v", "invalid_request",
                                "messages[0]", "non-empty `user` message"),
    "max_new_tokens 0": ({**GOOD, "max_new_tokens": 0}, "v", "invalid_request", "max_new_tokens",
                         "`max_new_tokens` must be between 1 and 1024, got 0"),
    "max_new_tokens as text": ({**GOOD, "max_new_tokens": "ten"}, "v", "invalid_request", "max_new_tokens", "integer"),
    "NaN temperature": ('{"type": "generate", "request_id": "v", "messages": [{"role": "user", "content": "hi"}], '
                        '"sampling": {"temperature": NaN}}', "v", "invalid_request", "sampling.temperature", "between 0 and 2"),
    "negative temperature": ({**GOOD, "sampling": {"temperature": -0.5}}, "v", "invalid_request",
                             "sampling.temperature", "between 0 and 2, got -0.5"),
    "top_p 0": ({**GOOD, "sampling": {"top_p": 0}}, "v", "invalid_request", "sampling.top_p", "(0, 1]"),
    "top_p above 1": ({**GOOD, "sampling": {"top_p": 1.5}}, "v", "invalid_request", "sampling.top_p", "(0, 1], got 1.5"),
    "top_k 0": ({**GOOD, "sampling": {"top_k": 0}}, "v", "invalid_request", "sampling.top_k", "between 1 and 1000, got 0"),
    "too many stop strings": ({**GOOD, "stop": ["a", "b", "c", "d", "e"]}, "v", "invalid_request", "stop", "at most 4"),
    "too long stop string": ({**GOOD, "stop": ["x" * 65]}, "v", "invalid_request", "stop", "1 to 64 characters, got 65"),
    "unknown delivery": ({**GOOD, "delivery": "pigeon"}, "v", "invalid_request", "delivery", "'stream', 'buffered'"),
    "wrong-typed kv_cache": ({**GOOD, "kv_cache": "yes"}, "v", "invalid_request", "kv_cache", "true or false"),
    "negative prefill_chunk": ({**GOOD, "prefill_chunk": -1}, "v", "invalid_request", "prefill_chunk", "between 0 and 8192"),
    "unknown overflow policy": ({**GOOD, "overflow": "ignore"}, "v", "invalid_request", "overflow", "'reject'"),
    "timeout_s 0": ({**GOOD, "timeout_s": 0}, "v", "invalid_request", "timeout_s", "(0, 300]"),
    "prompt past the context window": ({**GOOD, "messages": [{"role": "user", "content": "word " * 120}]}, "v",
                                       "context_overflow", "max_new_tokens", "512"),
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


def test_requests_in_flight_per_socket_and_the_queue_are_capped_with_immediate_errors(slow_server):
    """Per socket: 4 in flight, the fifth is `too_many_requests`. Server-wide: the queue holds 4
    waiting requests; past that a request is `overloaded` at once, with nothing queued."""
    with open_ws(slow_server) as first, open_ws(slow_server) as second:
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

def handshake(server, host: str | None = None, origin: str | None = None) -> tuple[socket.socket, bytes]:
    """A bare WebSocket handshake on a plain socket: the test alone decides every header and how
    the TCP connection ends. Returns the socket and the response head."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S)
    key = base64.b64encode(os.urandom(16)).decode()
    sock.sendall((f"GET /ws HTTP/1.1\r\nHost: {host or f'127.0.0.1:{server.port}'}\r\nUpgrade: websocket\r\n"
                  f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                  f"Origin: {origin or server.url}\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    return sock, head


def raw_ws(server) -> socket.socket:
    sock, head = handshake(server)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def send_text(sock: socket.socket, text: str) -> None:
    payload, mask = text.encode(), os.urandom(4)
    length = struct.pack("!BH", 0xFE, len(payload)) if len(payload) > 125 else bytes([0x80 | len(payload)])
    sock.sendall(bytes([0x81]) + length + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))


def read_until(sock: socket.socket, marker: bytes) -> None:
    seen = b""
    while marker not in seen:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        seen += chunk


def assert_served_normally(server) -> None:
    with open_ws(server) as ws:
        ws.send(generate("next", max_new_tokens=3))
        assert run_to_end(ws, "next")[-1]["type"] == "finished"


def test_a_clean_close_mid_stream_cancels_the_request_and_the_server_carries_on(slow_server):
    start = len(slow_server.log())
    with open_ws(slow_server) as ws:
        ws.send(generate("closed-1", max_new_tokens=400))
        until(ws, lambda e: e["type"] == "token")
    log = wait_for_log(slow_server, start, "request closed-1 ended: cancelled (disconnect, in decode")
    assert_served_normally(slow_server)
    assert "Traceback" not in slow_server.log()[start:] and "Traceback" not in log


def test_a_tcp_reset_mid_stream_cancels_the_request_quietly(slow_server):
    start = len(slow_server.log())
    sock = raw_ws(slow_server)
    send_text(sock, generate("reset-1", max_new_tokens=400))
    read_until(sock, b'"type": "token"')
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # linger 0: the kernel sends RST, not FIN
    wait_for_log(slow_server, start, "request reset-1 ended: cancelled (disconnect, in decode")
    assert_served_normally(slow_server)
    assert "Traceback" not in slow_server.log()[start:]


def test_a_reset_while_queued_drops_the_request_without_prefill(slow_server):
    start = len(slow_server.log())
    with open_ws(slow_server) as holder:
        holder.send(generate("holder", max_new_tokens=400))
        until(holder, lambda e: e["type"] == "token")
        sock = raw_ws(slow_server)
        send_text(sock, generate("queued-1", max_new_tokens=400))
        read_until(sock, b'"type": "queued"')
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
        wait_for_log(slow_server, start, "request queued-1 ended: cancelled (disconnect, in queued, 0 tokens)")
    assert "Traceback" not in slow_server.log()[start:]


# ---- who may connect -----------------------------------------------------------------------------

@pytest.mark.parametrize("origin", [None, "http://evil.example", "null", "http://127.0.0.1:1"])
def test_a_foreign_or_missing_origin_is_refused_with_403_before_any_model_work(fake_server, origin):
    start = len(fake_server.log())
    with pytest.raises(InvalidStatus) as info:
        connect(fake_server.ws_url, origin=origin, open_timeout=WAIT_S)
    assert info.value.response.status_code == 403
    assert "request" not in fake_server.log()[start:]


def test_a_rebinding_host_name_is_refused(fake_server):
    request = urllib.request.Request(fake_server.url + "/api/model", headers={"Host": f"evil.example:{fake_server.port}"})
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=WAIT_S)
    assert info.value.code == 403
    evil = f"evil.example:{fake_server.port}"
    sock, head = handshake(fake_server, host=evil, origin=f"http://{evil}")  # its own origin, so only Host can catch it
    sock.close()
    assert head.startswith(b"HTTP/1.1 403"), head


def test_http_api_answers_over_the_live_server(fake_server):
    with urllib.request.urlopen(fake_server.url + "/api/model", timeout=WAIT_S) as r:
        assert json.load(r)["facts"]["context_window"] == 512
        assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"]
    body = json.dumps({"messages": HI}).encode()
    request = urllib.request.Request(fake_server.url + "/api/prompt", data=body,
                                     headers={"Content-Type": "application/json", "Origin": fake_server.url})
    with urllib.request.urlopen(request, timeout=WAIT_S) as r:
        assert json.load(r)["counts"]["content"] > 0
    with urllib.request.urlopen(fake_server.url + "/healthz", timeout=WAIT_S) as r:
        assert r.status == 200
