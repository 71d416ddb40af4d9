"""Classroom mode (app/classroom/routes.py, the room in app/classroom/room.py) over Flask's test client and fake
sockets on the fake model: the teacher's key (constant-time, never logged), settings validation,
pause and cancel-all through the engine, per-laptop cap and rate limit, "show prompts" per request,
follow-me, the teacher's batch-invariant switch (through the engine, refused while prefix caching is on
and on a remote engine, announced on the feed), the class_state / class_stats / engine_submit shapes, LAN
Host names and "laptop N" labels; a remote engine (no `engine.local`) refuses pause and reports no tokens/s."""

from __future__ import annotations

import hmac
import json
import logging
import queue
import threading

import pytest
from kvscope_testkit import ask, events_of, wait_until

from app import create_app
from app.classroom import routes as classroom
from app.classroom.room import CANCEL_CAUSE
from app.ws.session import SessionSettings, run_session
from model_runner.local.scheduler import WAIT_PAUSED
from model_runner.protocol.metrics import percentile
from model_runner.shared.policy import Policy

pytestmark = pytest.mark.unit

KEY = "teacher-key-Zq81"
LAN = "192.168.1.20"
FAST = SessionSettings(max_inflight=4, idle_timeout_s=600.0, poll_s=0.02, drain_s=5.0)
TERMINAL = {"finished", "cancelled", "error"}
HI = [{"role": "user", "content": "Say hello."}]
TEACHER = {"X-Teacher-Key": KEY}


def class_app(engine, **config):
    return create_app(
        {
            "ENGINE": engine,
            "CLASS_MODE": True,
            "TEACHER_KEY": KEY,
            "BIND_HOST": "0.0.0.0",
            "CLASS_HOSTS": [LAN, "teacher-laptop"],
            "JOIN_URL": f"http://{LAN}:8000/",
            **config,
        }
    )


class FakeSocket:
    """simple-websocket's surface (receive / send / close), recording what the server sent."""

    def __init__(self):
        self.inbox: queue.Queue = queue.Queue()
        self.sent: list[dict] = []
        self._cond = threading.Condition()

    def push(self, message: dict) -> None:
        self.inbox.put(json.dumps(message))

    def receive(self, timeout=None):
        try:
            item = self.inbox.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, Exception):
            raise item
        return item

    def send(self, text: str) -> None:
        with self._cond:
            self.sent.append(json.loads(text))
            self._cond.notify_all()

    def close(self, code=None, reason=None) -> None:
        from simple_websocket import ConnectionClosed

        self.inbox.put(ConnectionClosed(code, reason))

    def wait_for(self, predicate, what: str) -> list[dict]:
        with self._cond:
            if not self._cond.wait_for(lambda: predicate(self.sent), timeout=30):
                raise AssertionError(f"never saw {what}; got {[e['type'] for e in self.sent]}")
            return list(self.sent)

    def of_type(self, kind: str) -> list[dict]:
        with self._cond:
            return [e for e in self.sent if e["type"] == kind]

    def end_of(self, rid: str) -> dict:
        sent = self.wait_for(lambda s: any(e.get("request_id") == rid and e["type"] in TERMINAL for e in s), rid)
        ends = [e for e in sent if e.get("request_id") == rid and e["type"] in TERMINAL]
        return ends[0]


class Laptop:
    """A socket in the class: a Session with its seat, on a thread of its own."""

    def __init__(self, app, engine, teacher: bool = False, laptop_id: str | None = None):
        self.ws = FakeSocket()
        self.seat = app.extensions[classroom.KEY].seat(teacher=teacher, laptop_id=laptop_id)
        self.thread = threading.Thread(
            target=run_session, args=(self.ws, engine, FAST), kwargs={"seat": self.seat}, daemon=True
        )
        self.thread.start()

    def generate(self, rid: str, content: str = "Say hello.", **fields) -> None:
        self.ws.push(
            {"type": "generate", "request_id": rid, "messages": [{"role": "user", "content": content}], **fields}
        )

    def leave(self) -> None:
        self.ws.close()
        self.thread.join(30)
        assert not self.thread.is_alive()


@pytest.fixture
def laptops():
    made = []

    def make(app, engine, teacher=False, laptop_id=None):
        made.append(Laptop(app, engine, teacher, laptop_id))
        return made[-1]

    yield make
    for laptop in made:
        laptop.leave()


# ---- the teacher's key ----------------------------------------------------------------------------

TEACHER_ROUTES = [
    ("/api/class/settings", {"paused": True}),
    ("/api/class/policy", {"max_num_seqs": 2}),
    ("/api/class/cancel-all", {}),
    ("/api/class/stage", {"stage": "prefill"}),
    ("/api/class/batch-invariant", {"on": True}),
]


@pytest.mark.parametrize("path,body", TEACHER_ROUTES)
def test_teacher_routes_refuse_without_the_key_and_change_nothing(fake_engine, path, body):
    client = class_app(fake_engine).test_client()
    policy = fake_engine.snapshot()["policy"]
    for headers in ({}, {"X-Teacher-Key": "wrong"}, {"X-Teacher-Key": KEY[:-1]}):
        answer = client.post(path, json=body, headers=headers)
        assert answer.status_code == 403
        assert answer.json["error"]["code"] == "teacher_only" and "teacher" in answer.json["error"]["message"]
    assert fake_engine.snapshot()["policy"] == policy and not fake_engine.paused
    assert fake_engine.batch_invariance() == {"on": False}


def test_the_key_in_the_url_becomes_a_strict_cookie_and_leaves_the_address_bar(fake_engine):
    client = class_app(fake_engine).test_client()
    assert client.get("/api/class").json["teacher"] is False
    answer = client.get(f"/class?key={KEY}")
    assert answer.status_code == 303 and answer.headers["Location"].endswith("/class")
    cookie = answer.headers["Set-Cookie"]
    assert cookie.startswith(f"{classroom.COOKIE}=") and "HttpOnly" in cookie
    assert "SameSite=Strict" in cookie and "Path=/" in cookie
    assert client.get("/api/class").json["teacher"] is True  # the cookie from here on
    assert client.post("/api/class/stage", json={"stage": "decode"}).json == {"stage": "decode"}


def test_the_class_page_says_who_is_the_teacher_and_a_wrong_key_sets_nothing(fake_engine):
    client = class_app(fake_engine).test_client()
    student = client.get("/class")
    assert student.status_code == 200 and f"http://{LAN}:8000/".encode() in student.data
    assert b'data-teacher="false"' in student.data and b'data-class-mode="true"' in student.data
    wrong = client.get("/class?key=guess")
    assert wrong.status_code == 403 and "Set-Cookie" not in wrong.headers
    client.get(f"/class?key={KEY}")
    assert b'data-teacher="true"' in client.get("/class").data


def test_the_header_works_too_and_the_key_is_compared_in_constant_time(fake_engine, monkeypatch):
    seen, real = [], hmac.compare_digest

    def compare(a, b):
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(classroom.hmac, "compare_digest", compare)
    client = class_app(fake_engine).test_client()
    assert client.post("/api/class/stage", json={"stage": "kv"}, headers=TEACHER).status_code == 200
    assert (KEY.encode(), KEY.encode()) in seen
    seen.clear()
    assert client.post("/api/class/stage", json={"stage": "kv"}, headers={"X-Teacher-Key": "x"}).status_code == 403
    assert seen, "a wrong key must be checked with hmac.compare_digest too"


def test_the_key_never_reaches_the_logs(fake_engine, caplog):
    caplog.set_level(logging.DEBUG)
    client = class_app(fake_engine).test_client()
    client.get(f"/class?key={KEY}")
    client.post("/api/class/settings", json={"show_prompts": True}, headers=TEACHER)
    client.post("/api/class/settings", json={"show_prompts": False, "per_laptop_cap": 99}, headers=TEACHER)
    client.post("/api/class/cancel-all", headers=TEACHER)
    client.post("/api/class/stage", json={"stage": "x"}, headers={"X-Teacher-Key": KEY + "x"})
    assert any(r.name.startswith("app") for r in caplog.records), "the teacher's actions are logged"
    assert KEY not in caplog.text


def test_off_class_mode_a_loopback_caller_is_the_teacher(fake_engine):
    client = create_app({"ENGINE": fake_engine}).test_client()
    state = client.get("/api/class").json
    assert state["teacher"] is True and state["class_mode"] is False
    assert client.post("/api/class/stage", json={"stage": "intro"}).status_code == 200
    remote = client.get("/api/class", environ_base={"REMOTE_ADDR": "10.0.0.9"}).json
    assert remote["teacher"] is False


# ---- settings ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body,field,says",
    [
        ({"paused": "yes"}, "paused", "true or false"),
        ({"show_prompts": 1}, "show_prompts", "true or false"),
        ({"per_laptop_cap": 0}, "per_laptop_cap", "between 1 and 32"),
        ({"per_laptop_cap": 2.5}, "per_laptop_cap", "between 1 and 32"),
        ({"rate_per_min": 601}, "rate_per_min", "between 1 and 600 or null"),
        ({"rate_per_min": True}, "rate_per_min", "between 1 and 600"),
        ({"volume": 11}, "volume", "not a class setting"),
    ],
)
def test_bad_settings_name_the_field_and_the_limit_and_change_nothing(fake_engine, body, field, says):
    client = class_app(fake_engine).test_client()
    before = client.get("/api/class").json["settings"]
    answer = client.post("/api/class/settings", json={"paused": True, **body}, headers=TEACHER)
    assert answer.status_code == 400
    assert answer.json["error"]["field"] == field and says in answer.json["error"]["message"]
    assert client.get("/api/class").json["settings"] == before and not fake_engine.paused


def test_settings_answer_what_is_now_in_force(fake_engine):
    client = class_app(fake_engine).test_client()
    body = {"show_prompts": True, "per_laptop_cap": 2, "rate_per_min": 30}
    settings = client.post("/api/class/settings", json=body, headers=TEACHER).json["settings"]
    assert settings == {**settings, **body}
    assert client.get("/api/class").json["settings"] == settings
    cleared = client.post("/api/class/settings", json={"rate_per_min": None}, headers=TEACHER).json["settings"]
    assert cleared["rate_per_min"] is None and cleared["per_laptop_cap"] == 2


# ---- pause and cancel-all ------------------------------------------------------------------------------


def test_pause_holds_admissions_and_resume_admits(engine_factory):
    engine = engine_factory("fake")
    client = class_app(engine).test_client()
    assert client.post("/api/class/settings", json={"paused": True}, headers=TEACHER).json["settings"]["paused"]
    handle = engine.submit(ask(max_new_tokens=3), "held")
    wait_until(lambda: handle.sequence.stream.last_position == (1, WAIT_PAUSED), "the request to wait, paused")
    steps = engine.steps
    assert engine.snapshot()["waiting"] == 1 and engine.steps == steps  # queued, never admitted
    assert client.post("/api/class/settings", json={"paused": False}, headers=TEACHER).status_code == 200
    events = events_of(handle)
    assert [e["reason"] for e in events if e["type"] == "queued"][0] == WAIT_PAUSED
    assert events[-1]["type"] == "finished" and engine.steps > steps


def test_cancel_all_ends_every_queued_and_running_request_once_as_the_teachers(engine_factory):
    engine = engine_factory("fake:delay=20", policy=Policy(max_num_seqs=1))
    client = class_app(engine).test_client()
    handles = [engine.submit(ask(max_new_tokens=200), f"r{i}") for i in range(3)]
    wait_until(lambda: engine.steps > 0, "the first request to run")
    assert client.post("/api/class/cancel-all", headers=TEACHER).json == {"cancelled": 3}
    for handle in handles:
        events = events_of(handle)
        ends = [e for e in events if e["type"] in TERMINAL]
        assert len(ends) == 1 and ends[0]["type"] == "cancelled" and ends[0]["cause"] == CANCEL_CAUSE
    assert engine.active == 0


# ---- per-laptop cap and rate limit ----------------------------------------------------------------------


def test_the_per_laptop_cap_refuses_with_an_error_naming_the_limit(engine_factory, laptops):
    engine = engine_factory("fake:delay=20", policy=Policy(max_num_seqs=1))
    app = class_app(engine)
    app.test_client().post("/api/class/settings", json={"per_laptop_cap": 1}, headers=TEACHER)
    laptop = laptops(app, engine)
    laptop.generate("a", max_new_tokens=50)
    laptop.ws.wait_for(lambda s: any(e["type"] == "accepted" for e in s), "a accepted")
    laptop.generate("b")
    refused = laptop.ws.end_of("b")
    assert refused["type"] == "error" and refused["code"] == "too_many_requests"
    assert "at most 1 request" in refused["message"] and "laptop" in refused["message"]
    assert laptop.ws.end_of("a")["type"] == "finished"


def test_the_rate_limit_refuses_the_request_over_it(fake_engine, laptops):
    app = class_app(fake_engine)
    app.test_client().post("/api/class/settings", json={"rate_per_min": 2}, headers=TEACHER)
    laptop, other = laptops(app, fake_engine), laptops(app, fake_engine)
    for rid in ("1", "2"):
        laptop.generate(rid, max_new_tokens=2)
        assert laptop.ws.end_of(rid)["type"] == "finished"
    laptop.generate("3", max_new_tokens=2)
    refused = laptop.ws.end_of("3")
    assert refused["type"] == "error" and refused["code"] == "rate_limited"
    assert "2 requests a minute" in refused["message"]
    other.generate("x", max_new_tokens=2)  # the limit is per laptop
    assert other.ws.end_of("x")["type"] == "finished"


def test_sockets_from_one_browser_are_one_laptop_with_one_cap_and_one_rate_limit(engine_factory, laptops):
    # The page opens a socket per request: the browser's laptop cookie makes them one laptop.
    engine = engine_factory("fake:delay=20", policy=Policy(max_num_seqs=1))
    app = class_app(engine)
    room = app.extensions[classroom.KEY]
    app.test_client().post("/api/class/settings", json={"per_laptop_cap": 1, "rate_per_min": 2}, headers=TEACHER)
    first, second = laptops(app, engine, laptop_id="browser-a"), laptops(app, engine, laptop_id="browser-a")
    other = laptops(app, engine, laptop_id="browser-b")
    assert first.seat.label == second.seat.label != other.seat.label
    assert room.laptops == 2
    first.generate("a", max_new_tokens=30)
    first.ws.wait_for(lambda s: any(e["type"] == "accepted" for e in s), "a accepted")
    second.generate("b", max_new_tokens=2)
    refused = second.ws.end_of("b")
    assert refused["code"] == "too_many_requests" and "at most 1 request" in refused["message"]
    assert first.ws.end_of("a")["type"] == "finished"
    second.generate("c", max_new_tokens=2)  # the cap is free again once "a" ended
    assert second.ws.end_of("c")["type"] == "finished"
    first.generate("d", max_new_tokens=2)  # "a" and "c" used this laptop's two requests a minute
    assert first.ws.end_of("d")["code"] == "rate_limited"
    other.generate("x", max_new_tokens=2)
    assert other.ws.end_of("x")["type"] == "finished"


def test_pages_give_a_browser_a_laptop_cookie_only_in_class_mode(fake_engine):
    answer = class_app(fake_engine).test_client().get("/")
    cookie = next(h for h in answer.headers.getlist("Set-Cookie") if h.startswith(classroom.LAPTOP_COOKIE + "="))
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    client = class_app(fake_engine).test_client()
    client.set_cookie(classroom.LAPTOP_COOKIE, "already-here")
    assert not any(h.startswith(classroom.LAPTOP_COOKIE) for h in client.get("/").headers.getlist("Set-Cookie"))
    plain = create_app({"ENGINE": fake_engine}).test_client().get("/")
    assert not any(h.startswith(classroom.LAPTOP_COOKIE) for h in plain.headers.getlist("Set-Cookie"))


# ---- show prompts ----------------------------------------------------------------------------------------


def test_turning_show_prompts_off_withdraws_the_text_of_requests_still_in_flight(engine_factory, laptops):
    # Sent while "show prompts" was on, admitted after it was turned off (the class was paused):
    # nothing of its text may reach the feed from then on.
    engine = engine_factory("fake")
    app = class_app(engine)
    teacher = app.test_client()
    teacher.post("/api/class/settings", json={"show_prompts": True, "paused": True}, headers=TEACHER)
    feed = engine.feed.subscribe(capacity=100_000)
    laptop = laptops(app, engine)
    laptop.generate("held", content="secret held", max_new_tokens=3)
    laptop.ws.wait_for(lambda s: any(e["type"] == "queued" for e in s), "held queued")
    teacher.post("/api/class/settings", json={"show_prompts": False, "paused": False}, headers=TEACHER)
    assert laptop.ws.end_of("held")["type"] == "finished"
    events = []  # the laptop's terminal event may come before the feed's engine_end: wait for that one
    while not any(e["type"] == "engine_end" for e in events):
        event = feed.next_event(10)
        assert event is not None, f"no engine_end on the feed after {[e['type'] for e in events]}"
        events.append(event)
    events += list(iter(lambda: feed.next_event(0), None))
    feed.close()
    submitted = [e for e in events if e["type"] == "engine_submit"]
    assert len(submitted) == 1 and submitted[0]["prompt"] == "secret held"  # sent while it was on
    later = [e for e in events if e["type"] in ("engine_admit", "engine_end")]
    assert len(later) == 2 and not any("secret held" in json.dumps(e) or "answer" in e for e in later)


def test_a_request_the_engine_refuses_does_not_use_up_the_rate_limit(engine_factory, laptops):
    engine = engine_factory("fake", max_queue=1, policy=Policy(max_num_seqs=1))
    app = class_app(engine)
    app.test_client().post("/api/class/settings", json={"rate_per_min": 2}, headers=TEACHER)
    first, second = laptops(app, engine, laptop_id="a"), laptops(app, engine, laptop_id="b")
    engine.set_paused(True)  # the queue stays full while the other laptop asks
    first.generate("fills-the-queue", max_new_tokens=2)
    first.ws.wait_for(lambda s: any(e["type"] == "queued" for e in s), "queued")
    second.generate("refused", max_new_tokens=2)
    assert second.ws.end_of("refused")["code"] == "overloaded"
    engine.set_paused(False)
    assert first.ws.end_of("fills-the-queue")["type"] == "finished"
    for rid in ("one", "two"):  # both of its two requests a minute are still there
        second.generate(rid, max_new_tokens=2)
        assert second.ws.end_of(rid)["type"] == "finished"


def test_prompt_text_reaches_the_feed_only_for_requests_sent_while_show_prompts_was_on(engine_factory, laptops):
    engine = engine_factory("fake")
    app = class_app(engine)
    teacher = app.test_client()
    feed = engine.feed.subscribe(capacity=100_000)
    laptop = laptops(app, engine)

    def send(rid):
        laptop.generate(rid, content=f"secret {rid}", max_new_tokens=3)
        assert laptop.ws.end_of(rid)["type"] == "finished"

    send("before")
    teacher.post("/api/class/settings", json={"show_prompts": True}, headers=TEACHER)
    notice = laptop.ws.wait_for(lambda s: any(e["type"] == "class_notice" for e in s), "the notice")
    assert [e for e in notice if e["type"] == "class_notice"][-1]["show_prompts"] is True
    send("during")
    teacher.post("/api/class/settings", json={"show_prompts": False}, headers=TEACHER)
    send("after")
    events = list(iter(lambda: feed.next_event(0), None))
    feed.close()
    keys = {e["request"]: e["label"] for e in events if e["type"] == "engine_submit"}
    assert len(keys) == 3
    texts = {}
    for e in events:
        if e["type"] in ("engine_submit", "engine_admit", "engine_end"):
            texts.setdefault(e["request"], []).append(e.get("prompt") or e.get("answer"))
    shown = [k for k, t in texts.items() if any(t)]
    assert len(shown) == 1 and all(texts[shown[0]])  # submit, admit and end of that one request only
    assert any("secret during" in (e.get("prompt") or "") for e in events)
    assert not any("secret before" in json.dumps(e) or "secret after" in json.dumps(e) for e in events)
    assert [e["show_prompts"] for e in laptop.ws.of_type("class_notice")] == [True, False]


# ---- batch-invariant mode ------------------------------------------------------------------------------------


class AsRemote:
    """The fake engine as the app sees a remote one: no local controls (model_runner/interface.py)."""

    local = None

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)


def switch(client, body, headers=TEACHER):
    return client.post("/api/class/batch-invariant", json=body, headers=headers)


def test_the_teacher_switches_batch_invariant_mode_on_and_off_as_api_model_and_api_class_report(engine_factory):
    engine = engine_factory("fake")
    client = class_app(engine).test_client()
    assert client.get("/api/class").json["batch_invariant"] == {"on": False}
    answer = switch(client, {"on": True})
    assert answer.status_code == 200 and answer.json["batch_invariant"]["on"] is True
    assert engine.batch_invariance()["on"] is True
    assert client.get("/api/model").json["batch_invariant"]["on"] is True
    # a request served in the mode: the engine's kernel check ran at the mode's fixed row count
    assert events_of(engine.submit(ask(max_new_tokens=3), "in-the-mode"))[-1]["type"] == "finished"
    report = client.get("/api/model").json["batch_invariant"]
    assert report["claimed"] is True and report["rows"] == engine.policy.max_num_seqs
    assert client.get("/api/class").json["batch_invariant"] == report  # what the page reads on a reload
    off = switch(client, {"on": False})
    assert off.status_code == 200 and off.json["batch_invariant"] == {"on": False}
    assert client.get("/api/model").json["batch_invariant"] == {"on": False}
    assert client.get("/api/class").json["batch_invariant"] == {"on": False}
    assert engine.batch_invariance() == {"on": False}


def test_the_switch_reaches_every_class_view_on_the_feed(engine_factory):
    engine = engine_factory("fake")
    client = class_app(engine).test_client()
    feed = engine.feed.subscribe(capacity=1000)
    try:
        answer = switch(client, {"on": True}).json["batch_invariant"]
        events = list(iter(lambda: feed.next_event(0), None))
    finally:
        feed.close()
    states = [e for e in events if e["type"] == "class_state"]
    assert len(states) == 1 and states[0]["batch_invariant"] == answer
    assert set(states[0]) >= {"laptops", "settings"} and states[0]["settings"]["paused"] is False


@pytest.mark.parametrize(
    "body,field,says",
    [
        ({"on": "yes"}, "on", "`on` must be true or false"),
        ({"on": 1}, "on", "`on` must be true or false"),
        ({}, "on", "`on` is required"),
        ({"on": None}, "on", "`on` must be true or false"),
        ({"on": True, "rows": 8}, "rows", "takes only `on`"),
    ],
)
def test_a_bad_switch_names_the_field_and_changes_nothing(fake_engine, body, field, says):
    answer = switch(class_app(fake_engine).test_client(), body)
    assert answer.status_code == 400
    assert answer.json["error"]["field"] == field and says in answer.json["error"]["message"]
    assert fake_engine.batch_invariance() == {"on": False}


def test_the_switch_is_refused_while_prefix_caching_is_on_and_works_once_it_is_off(engine_factory):
    engine = engine_factory("fake", policy=Policy(prefix_caching=True))
    client = class_app(engine).test_client()
    refused = switch(client, {"on": True})
    assert refused.status_code == 400 and refused.json["error"]["field"] == "prefix_caching"
    assert "turn prefix caching off" in refused.json["error"]["message"]
    assert engine.batch_invariance() == {"on": False}
    assert client.get("/api/class").json["batch_invariant"]["on"] is False
    client.post("/api/class/policy", json={"prefix_caching": False}, headers=TEACHER)
    assert switch(client, {"on": True}).json["batch_invariant"]["on"] is True
    back = client.post("/api/class/policy", json={"prefix_caching": True}, headers=TEACHER)  # the mode keeps it off
    assert back.status_code == 400 and back.json["error"]["field"] == "prefix_caching"


def test_a_remote_engine_has_no_batch_invariant_mode_and_says_so_by_name(fake_engine):
    client = class_app(AsRemote(fake_engine)).test_client()
    state = client.get("/api/class").json["batch_invariant"]
    assert state["on"] is False and "built-in engine" in state["why_unavailable"]
    refused = switch(client, {"on": True})
    assert refused.status_code == 400 and refused.json["error"]["field"] == "batch_invariant"
    assert "batch-invariant mode is a mode of the built-in engine" in refused.json["error"]["message"]
    assert fake_engine.batch_invariance() == {"on": False}


# ---- shapes the class page reads ----------------------------------------------------------------------------


def test_api_class_shape(fake_engine):
    state = class_app(fake_engine).test_client().get("/api/class").json
    assert set(state) == {"class_mode", "join_url", "teacher", "laptops", "settings", "policy", "batch_invariant"}
    assert state["join_url"] == f"http://{LAN}:8000/" and state["class_mode"] is True
    assert set(state["settings"]) == {"paused", "show_prompts", "per_laptop_cap", "rate_per_min", "follow_stage"}
    assert state["policy"] == fake_engine.snapshot()["policy"]
    assert state["batch_invariant"] == fake_engine.batch_invariance() == {"on": False}


def test_subscribers_get_class_state_then_class_stats_and_engine_submit(fake_engine, laptops):
    app = class_app(fake_engine)
    projector = laptops(app, fake_engine, teacher=True)
    student = laptops(app, fake_engine)
    projector.ws.push({"type": "subscribe"})
    sent = projector.ws.wait_for(lambda s: any(e["type"] == "class_state" for e in s), "class_state")
    assert [e["type"] for e in sent[:2]] == ["engine_snapshot", "class_state"]
    state = sent[1]
    assert state["laptops"] == 1  # the student; the projector holds the teacher's key
    assert set(state["settings"]) == {"paused", "show_prompts", "per_laptop_cap", "rate_per_min", "follow_stage"}
    student.generate("q", max_new_tokens=3)
    assert student.ws.end_of("q")["type"] == "finished"
    submit = projector.ws.wait_for(lambda s: any(e["type"] == "engine_submit" for e in s), "engine_submit")
    submit = next(e for e in submit if e["type"] == "engine_submit")
    assert {"request", "label", "prompt_tokens", "t_ms"} <= set(submit) and "prompt" not in submit
    assert submit["label"] == student.seat.label and submit["prompt_tokens"] > 0
    stats = projector.ws.wait_for(lambda s: any(e["type"] == "class_stats" for e in s), "class_stats")
    stats = next(e for e in stats if e["type"] == "class_stats")
    keys = {"waiting", "running", "finished", "cancelled", "errors", "tokens_per_s", "ttft_ms", "tpot_ms"}
    assert keys | {"window_s", "feed_dropped"} <= set(stats)
    assert set(stats["ttft_ms"]) == set(stats["tpot_ms"]) == {"p50", "p95", "n"}
    assert stats["window_s"] == 60 and stats["feed_dropped"] == 0


def test_class_stats_agree_with_the_engines_own_metrics(engine_factory):
    engine = engine_factory("fake")
    room = class_app(engine).extensions[classroom.KEY]
    ends = [events_of(engine.submit(ask(max_new_tokens=n), f"m{n}"))[-1] for n in (2, 4, 6, 8)]
    stats = room.stats()
    ttft = [e["metrics"]["ttft_ms"] for e in ends]
    tpot = [e["metrics"]["tpot_ms"] for e in ends]
    assert stats["finished"] == 4 and stats["waiting"] == stats["running"] == 0
    assert stats["ttft_ms"]["p50"] == pytest.approx(percentile(ttft, 50), abs=1e-3)
    assert stats["ttft_ms"]["p95"] == pytest.approx(percentile(ttft, 95), abs=1e-3)
    assert stats["tpot_ms"]["p95"] == pytest.approx(percentile(tpot, 95), abs=1e-3)
    assert stats["tokens_per_s"] is not None and stats["tokens_per_s"] >= 0


def test_a_laptop_joining_and_leaving_updates_class_state(fake_engine, laptops):
    app = class_app(fake_engine)
    projector = laptops(app, fake_engine, teacher=True)
    projector.ws.push({"type": "subscribe"})
    projector.ws.wait_for(lambda s: any(e["type"] == "class_state" for e in s), "class_state")
    student = laptops(app, fake_engine)
    projector.ws.wait_for(lambda s: [e["laptops"] for e in s if e["type"] == "class_state"][-1] == 1, "1 laptop")
    assert app.test_client().get("/api/class").json["laptops"] == 1
    student.leave()
    projector.ws.wait_for(lambda s: [e["laptops"] for e in s if e["type"] == "class_state"][-1] == 0, "0 laptops")


def test_follow_me_sends_the_stage_now_and_on_every_change(fake_engine, laptops):
    app = class_app(fake_engine)
    teacher = app.test_client()
    teacher.post("/api/class/stage", json={"stage": "prefill"}, headers=TEACHER)
    follower, other = laptops(app, fake_engine), laptops(app, fake_engine)
    follower.ws.push({"type": "follow"})
    follower.ws.wait_for(lambda s: [e.get("stage") for e in s if e["type"] == "class_stage"] == ["prefill"], "now")
    teacher.post("/api/class/stage", json={"stage": "decode"}, headers=TEACHER)
    follower.ws.wait_for(lambda s: [e.get("stage") for e in s if e["type"] == "class_stage"][-1:] == ["decode"], "d")
    follower.ws.push({"type": "unfollow"})
    other.generate("sync", max_new_tokens=1)  # the unfollow is read before this socket's next frame is
    follower.generate("sync", max_new_tokens=1)
    follower.ws.end_of("sync")
    teacher.post("/api/class/stage", json={"stage": "kv"}, headers=TEACHER)
    other.ws.end_of("sync")
    assert [e["stage"] for e in follower.ws.of_type("class_stage")] == ["prefill", "decode"]
    assert other.ws.of_type("class_stage") == []
    bad = teacher.post("/api/class/stage", json={"stage": "<script>"}, headers=TEACHER)
    assert bad.status_code == 400 and bad.json["error"]["field"] == "stage"


# ---- hosts and labels ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("host,ok", [(f"{LAN}:8000", True), ("teacher-laptop:8000", True), ("localhost:8000", True)])
def test_class_hosts_are_answered(fake_engine, host, ok):
    assert class_app(fake_engine).test_client().get("/api/class", headers={"Host": host}).status_code == 200


@pytest.mark.parametrize("host", ["evil.example", "192.168.1.21:8000", "teacher-laptop.evil.example"])
def test_other_hosts_are_still_refused_in_class_mode(fake_engine, host):
    answer = class_app(fake_engine).test_client().get("/api/class", headers={"Host": host})
    assert answer.status_code == 403 and answer.json["code"] == "bad_host"


def test_sockets_are_labelled_laptop_n_in_class_mode_only(fake_engine):
    room = class_app(fake_engine).extensions[classroom.KEY]
    labels = [room.seat(teacher=False).label for _ in range(3)]
    assert labels == ["laptop 1", "laptop 2", "laptop 3"]
    plain = create_app({"ENGINE": fake_engine}).extensions[classroom.KEY]
    assert plain.seat(teacher=False).label == ""  # the session keeps its own "socket N"


def test_the_join_qr_code_is_an_svg_of_the_join_url(fake_engine):
    answer = class_app(fake_engine).test_client().get("/class/qr.svg")
    assert answer.status_code == 200 and answer.mimetype == "image/svg+xml" and b"<svg" in answer.data
    other = class_app(fake_engine, JOIN_URL="http://10.1.1.1:8000/").test_client().get("/class/qr.svg")
    assert other.data != answer.data  # drawn from the join URL, not a fixed picture


# ---- class-sim's bookkeeping -----------------------------------------------------------------------------


def test_class_sim_counts_a_missing_or_second_terminal_event_as_a_violation():
    from bench.class_sim import _Request, _Student, summarize
    from bench.clients import RequestRecord

    student = _Student(1, "ws://x/ws", "http://x", seed=0, plan={})
    student.connected = True
    for rid in ("once", "twice", "never"):
        student.requests[rid] = _Request(RequestRecord(rid), "kind", None)
    token = {"type": "token", "t_ms": 1.0, "id": 5, "step_ms": 1.0}
    end = {"type": "finished", "t_ms": 2.0, "reason": "max_tokens", "metrics": {"ttft_ms": 1.0, "tpot_ms": None}}
    for rid, frames in {"once": [token, end], "twice": [token, end, end]}.items():
        for frame in frames:
            student._take(None, {**frame, "request_id": rid}, 0.0)
    student.requests["never"].record.fail("no_terminal", "gave up")
    summary = summarize([student], None, 1.0)
    assert summary.requests == 3 and summary.terminal_violations == 2 and not summary.ok
    assert summary.finished == 2 and summary.errors == {"no_terminal": 1}
    del student.requests["twice"], student.requests["never"]
    assert summarize([student], None, 1.0).ok
