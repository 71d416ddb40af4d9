"""The WebSocket session logic (app/ws/session.py) against a fake socket and the engine's fake model:
request ids echoed, one terminal event per request, errors that leave the socket usable, caps,
cancellation on cancel / close / broken sends, and the engine never sending to the socket."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time

import pytest
from kvscope_testkit import wait_until
from simple_websocket import ConnectionClosed

from app.protocol import parse_json_object
from app.ws.session import SessionSettings, run_session
from model_runner.loading.fake import ANSWER
from model_runner.loading.loader import load
from model_runner.local.engine import Engine, EngineConfig
from model_runner.protocol.errors import UserError
from model_runner.shared.policy import Policy

WAIT_S = 30.0  # generous deadline for a condition that holds in milliseconds; never a timing claim
FAST = SessionSettings(max_inflight=4, idle_timeout_s=600.0, poll_s=0.02, drain_s=5.0)
TERMINAL = {"finished", "cancelled", "error"}
HI = [{"role": "user", "content": "Say hello."}]


def generate(rid, **fields):
    return json.dumps({"type": "generate", "request_id": rid, "messages": HI, **fields})


class FakeSocket:
    """simple-websocket's surface: receive(timeout) / send(text) / close(code, reason)."""

    def __init__(self, send_error: Exception | None = None, on_send=None):
        self.inbox: queue.Queue = queue.Queue()
        self.sent: list[dict] = []
        self.senders: set[str] = set()
        self.closed_with = None
        self.send_error = send_error
        self.on_send = on_send
        self._cond = threading.Condition()

    # the client side
    def push(self, frame) -> None:
        self.inbox.put(frame)

    def hang_up(self) -> None:
        self.inbox.put(ConnectionClosed(1000, ""))

    def wait_for(self, predicate, what: str) -> list[dict]:
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self.sent), timeout=WAIT_S):
                raise AssertionError(f"never saw {what}; got {[e['type'] for e in self.sent]}")
            return list(self.sent)

    def terminal(self, rid) -> dict:
        events = self.wait_for(
            lambda sent: any(e["request_id"] == rid and e["type"] in TERMINAL for e in sent), f"the end of {rid}"
        )
        return next(e for e in events if e["request_id"] == rid and e["type"] in TERMINAL)

    def of(self, rid) -> list[dict]:
        with self._cond:
            return [e for e in self.sent if e["request_id"] == rid]

    # the server side
    def receive(self, timeout=None):
        try:
            item = self.inbox.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, Exception):
            raise item
        return item

    def send(self, text: str) -> None:
        self.senders.add(threading.current_thread().name)
        if self.send_error is not None:
            raise self.send_error
        event = json.loads(text)
        with self._cond:
            self.sent.append(event)
            self._cond.notify_all()
        if self.on_send:
            self.on_send(self, event)

    def close(self, code=None, reason=None) -> None:
        self.closed_with = (code, reason)
        self.inbox.put(ConnectionClosed(code, reason))


class Recorder:
    """Wraps an engine and keeps every handle it gives out, to see how each request really ended."""

    def __init__(self, engine):
        self.engine = engine
        self.handles = {}

    def submit(self, params, request_id, label=""):
        handle = self.engine.submit(params, request_id, label)
        self.handles[request_id] = handle
        return handle

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def ended(self, rid):
        handle = self.handles[rid]
        wait_until(lambda: handle.terminal is not None, f"request {rid} to end", WAIT_S, every=0.01)
        return handle.terminal.to_dict()


def start(ws, engine, settings=FAST) -> threading.Thread:
    thread = threading.Thread(target=run_session, args=(ws, engine, settings), name="reader", daemon=True)
    thread.start()
    return thread


def finish(ws, thread) -> None:
    ws.hang_up()
    thread.join(WAIT_S)
    assert not thread.is_alive()


@pytest.fixture(scope="module")
def fake():
    return load("fake")


@pytest.fixture
def slow_engine(engine_factory):
    """40 ms per model step, one request at a time: a request is still decoding when the test acts
    on it, and a second one is still queued."""
    return Recorder(engine_factory("fake:delay=40", policy=Policy(max_num_seqs=1)))


@pytest.fixture
def stalled_engine(fake):
    """Ready but with no worker: whatever is submitted stays queued, deterministically."""
    return Recorder(Engine(EngineConfig(model="fake", max_queue=2), loaded=fake))


# ---- decoding frames -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "frame, says",
    [
        (b'{"type": "generate"}', "binary frames"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"type": "generate", "x": "\\ud800"}', "unpaired surrogate"),
    ],
)
def test_undecodable_frames_are_refused_with_a_reason(frame, says):
    with pytest.raises(UserError) as info:
        parse_json_object(frame)
    assert info.value.code == "invalid_json" and says in info.value.message


def test_nan_passes_decoding_so_the_field_check_can_name_it():
    assert parse_json_object('{"sampling": {"temperature": NaN}}')["sampling"]["temperature"] != 0


# ---- a whole request -------------------------------------------------------------------------


def test_generate_streams_every_event_tagged_and_ends_once(fake_engine):
    ws = FakeSocket()
    reader = start(ws, fake_engine)
    ws.push(generate("r1", max_new_tokens=400))
    end = ws.terminal("r1")
    events = ws.of("r1")
    assert [e["type"] for e in events][:1] == ["accepted"]
    assert sum(e["type"] in TERMINAL for e in events) == 1 and events[-1] is end
    assert end["type"] == "finished" and end["reason"] == "eos" and end["text"] == ANSWER
    assert "".join(e["text"] for e in events if e["type"] == "token") == ANSWER
    assert {e["request_id"] for e in events} == {"r1"}
    finish(ws, reader)
    assert "kvscope-engine" not in ws.senders, "the engine worker must never send to a socket"


def test_several_requests_run_one_after_another_on_one_socket(fake_engine):
    ws = FakeSocket()
    reader = start(ws, fake_engine)
    for rid in ("a", "b", "c"):
        ws.push(generate(rid, max_new_tokens=5))
        assert ws.terminal(rid)["type"] == "finished"
    ws.push(generate("a", max_new_tokens=3))  # an id may be reused once its request has ended
    ws.wait_for(lambda sent: sum(e["request_id"] == "a" and e["type"] == "finished" for e in sent) == 2, "a again")
    finish(ws, reader)


def test_the_slot_is_free_as_soon_as_the_client_sees_the_end(fake_engine):
    """A client that starts its next request the moment one ends must never hit the cap.

    The next frame arrives while the terminal event is still being sent; the send waits until the
    reader has decided about it, so a slot freed only after the send would be refused every time."""
    engine = Recorder(fake_engine)

    def next_on_end(ws, event):
        n = int(event["request_id"][1:])
        if event["type"] in TERMINAL and n < 4:
            ws.push(generate(f"q{n + 1}", max_new_tokens=2))
            deadline = time.monotonic() + 5.0
            while f"q{n + 1}" not in engine.handles and time.monotonic() < deadline:
                time.sleep(0.005)

    ws = FakeSocket(on_send=next_on_end)
    reader = start(ws, engine, SessionSettings(max_inflight=1, poll_s=0.02))
    ws.push(generate("q1", max_new_tokens=2))
    ends = [ws.terminal(f"q{n}") for n in range(1, 5)]
    assert [e["type"] for e in ends] == ["finished"] * 4
    finish(ws, reader)


# ---- errors leave the socket usable ------------------------------------------------------------


@pytest.mark.parametrize(
    "frame, field",
    [
        ("{oops", None),
        (b"\x00\x01", None),
        ('"just a string"', None),
        ('{"type": "watch", "request_id": "r1"}', "type"),
        ('{"request_id": "r1", "messages": []}', "type"),
        ('{"type": "generate", "messages": [{"role": "user", "content": "hi"}]}', "request_id"),
        ('{"type": "generate", "request_id": 7, "messages": [{"role": "user", "content": "hi"}]}', "request_id"),
        ('{"type": "generate", "request_id": "has space", "messages": []}', "request_id"),
        ('{"type": "generate", "request_id": "' + "x" * 65 + '", "messages": []}', "request_id"),
        ('{"type": "cancel"}', "request_id"),
    ],
)
def test_a_frame_without_a_usable_request_id_is_answered_with_null(fake_engine, frame, field):
    ws = FakeSocket()
    reader = start(ws, fake_engine)
    ws.push(frame)
    error = ws.wait_for(lambda sent: sent, "an error")[0]
    assert error["type"] == "error" and error["request_id"] is None and error["field"] == field
    assert error["code"] == ("invalid_json" if field is None else "invalid_request")
    ws.push(generate("after", max_new_tokens=2))
    assert ws.terminal("after")["type"] == "finished", "the socket must stay usable"
    finish(ws, reader)


@pytest.mark.parametrize(
    "fields, field, says",
    [
        ({"max_new_tokens": 0}, "max_new_tokens", "between 1 and 1024, got 0"),
        ({"sampling": {"top_p": 0}}, "sampling.top_p", "(0, 1]"),
        ({"messages": [{"role": "user", "content": "x" * 600}]}, "max_new_tokens", "512"),  # past the fake's window
    ],
)
def test_a_bad_generate_ends_that_request_with_an_error_naming_field_and_limit(fake_engine, fields, field, says):
    ws = FakeSocket()
    reader = start(ws, fake_engine)
    ws.push(generate("bad", **fields))
    error = ws.terminal("bad")
    assert error["type"] == "error" and error["field"] == field and says in error["message"]
    assert [e["type"] for e in ws.of("bad")] == ["error"]
    ws.push(generate("good", max_new_tokens=2))
    assert ws.terminal("good")["type"] == "finished"
    finish(ws, reader)


def test_a_duplicate_in_flight_id_is_refused_without_touching_the_first(stalled_engine):
    ws = FakeSocket()
    reader = start(ws, stalled_engine)
    ws.push(generate("dup"))
    ws.wait_for(lambda sent: any(e["type"] == "accepted" for e in sent), "accepted")
    ws.push(generate("dup"))
    error = ws.wait_for(lambda sent: any(e["type"] == "error" for e in sent), "an error")[-1]
    assert error["request_id"] is None and error["field"] == "request_id" and "in flight" in error["message"]
    ws.push(json.dumps({"type": "cancel", "request_id": "dup"}))
    assert ws.terminal("dup")["type"] == "cancelled"
    finish(ws, reader)


def test_requests_in_flight_per_socket_are_capped(stalled_engine):
    ws = FakeSocket()
    reader = start(ws, stalled_engine, SessionSettings(max_inflight=2, poll_s=0.02))
    ws.push(generate("one"))
    ws.push(generate("two"))
    ws.push(generate("three"))
    error = ws.terminal("three")
    assert error["code"] == "too_many_requests" and "at most 2" in error["message"]
    ws.push(json.dumps({"type": "cancel", "request_id": "one"}))
    ws.terminal("one")
    ws.push(generate("four"))
    ws.wait_for(lambda sent: any(e["request_id"] == "four" and e["type"] == "accepted" for e in sent), "four accepted")
    finish(ws, reader)


def test_a_full_engine_queue_answers_overloaded_at_once(stalled_engine):
    ws = FakeSocket()
    reader = start(ws, stalled_engine)
    for rid in ("q1", "q2", "q3"):  # the stalled engine's queue holds 2
        ws.push(generate(rid))
    error = ws.terminal("q3")
    assert error["type"] == "error" and error["code"] == "overloaded"
    assert "q3" not in stalled_engine.handles, "nothing was queued"
    finish(ws, reader)


def test_a_model_still_loading_is_an_error_not_a_hang():
    loading = Engine(EngineConfig(model="fake"))  # never started: stays "loading"
    ws = FakeSocket()
    reader = start(ws, loading)
    ws.push(generate("early"))
    assert ws.terminal("early")["code"] == "model_loading"
    finish(ws, reader)


def test_an_engine_that_raises_gives_internal_and_the_session_lives_on():
    class Broken:
        def submit(self, params, request_id, label=""):
            raise RuntimeError("boom")

    ws = FakeSocket()
    reader = start(ws, Broken())
    ws.push(generate("x"))
    assert ws.terminal("x")["code"] == "internal"
    ws.push("{")
    ws.wait_for(lambda sent: len(sent) == 2, "a second answer")
    finish(ws, reader)


def test_a_bug_met_by_one_frame_is_answered_with_internal_and_the_socket_lives_on(caplog):
    class BuggyHandle:
        def next_event(self, timeout=None):
            time.sleep(timeout or 0)

        def cancel(self, cause="client"):
            raise RuntimeError("bug in cancel")

    class Buggy:
        def submit(self, params, request_id, label=""):
            return BuggyHandle()

    ws = FakeSocket()
    reader = start(ws, Buggy(), SessionSettings(poll_s=0.02, drain_s=0.1))
    ws.push(generate("b1"))
    ws.push(json.dumps({"type": "cancel", "request_id": "b1"}))
    error = ws.wait_for(lambda sent: sent, "an error")[0]
    assert (error["request_id"], error["code"]) == (None, "internal")
    ws.push("{")
    ws.wait_for(lambda sent: len(sent) == 2, "a second answer")
    finish(ws, reader)


# ---- cancellation --------------------------------------------------------------------------------


def test_cancel_stops_a_decoding_request_with_its_partial_text(slow_engine):
    ws = FakeSocket()
    reader = start(ws, slow_engine)
    ws.push(generate("c1", max_new_tokens=400))
    ws.wait_for(lambda sent: any(e["type"] == "token" for e in sent), "a token")
    ws.push(json.dumps({"type": "cancel", "request_id": "c1"}))
    end = ws.terminal("c1")
    assert end["type"] == "cancelled" and end["cause"] == "client" and end["state"] == "decode"
    assert ANSWER.startswith(end["text"]) and len(end["text"]) < len(ANSWER)
    finish(ws, reader)


def test_cancel_for_a_request_not_in_flight_is_ignored(fake_engine):
    ws = FakeSocket()
    reader = start(ws, fake_engine)
    ws.push(json.dumps({"type": "cancel", "request_id": "never-sent"}))
    ws.push(generate("next", max_new_tokens=2))
    ws.terminal("next")
    assert all(e["request_id"] == "next" for e in ws.sent)
    finish(ws, reader)


def test_closing_the_socket_cancels_every_request_in_flight(slow_engine):
    ws = FakeSocket()
    reader = start(ws, slow_engine)
    ws.push(generate("running", max_new_tokens=400))
    ws.push(generate("waiting", max_new_tokens=400))
    ws.wait_for(lambda sent: any(e["type"] == "token" for e in sent), "a token")
    finish(ws, reader)
    running, waiting = slow_engine.ended("running"), slow_engine.ended("waiting")
    assert (running["type"], running["cause"], running["state"]) == ("cancelled", "disconnect", "decode")
    assert (waiting["type"], waiting["cause"], waiting["state"]) == ("cancelled", "disconnect", "queued")


@pytest.mark.parametrize(
    "failure, cause",
    [
        (BrokenPipeError(32, "Broken pipe"), "disconnect"),
        (ConnectionResetError(104, "Connection reset by peer"), "disconnect"),
        (ConnectionClosed(1006, ""), "disconnect"),
        (BlockingIOError(11, "send timed out"), "slow_client"),
    ],
)
def test_a_send_that_fails_ends_the_session_quietly_and_cancels(stalled_engine, caplog, failure, cause):
    ws = FakeSocket(send_error=failure)
    reader = start(ws, stalled_engine)
    ws.push(generate("doomed"))
    reader.join(WAIT_S)
    assert not reader.is_alive(), "the reader must notice the dead socket by itself"
    end = stalled_engine.ended("doomed")
    assert (end["type"], end["cause"]) == ("cancelled", cause)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


def test_an_idle_socket_is_closed_normally(fake_engine):
    ws = FakeSocket()
    reader = start(ws, fake_engine, SessionSettings(idle_timeout_s=0.05, poll_s=0.01))
    reader.join(WAIT_S)
    assert not reader.is_alive() and ws.closed_with[0] == 1000
