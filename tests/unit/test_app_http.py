"""The Flask app over HTTP (test client): the JSON API, the page shell, configuration, and the
browser-facing defences (Host check, Origin check on the WebSocket handshake, security headers)."""

from __future__ import annotations

import pytest

from app import create_app
from app.security import normalize_origin, split_host
from model_runner.loading.loader import load
from model_runner.local.engine import Engine, EngineConfig

CONVERSATION = {
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
    "max_new_tokens": 16,
}
WS_UPGRADE = {
    "Upgrade": "websocket",
    "Connection": "Upgrade",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    "Sec-WebSocket-Version": "13",
}


class Counting:
    """An engine stand-in that counts any attempt at model work."""

    def __init__(self, engine):
        self.engine = engine
        self.calls = 0

    def submit(self, *args, **kwargs):
        self.calls += 1
        return self.engine.submit(*args, **kwargs)

    def describe_prompt(self, *args, **kwargs):
        self.calls += 1
        return self.engine.describe_prompt(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.engine, name)


class Unhealthy:
    local = None  # as a remote engine: no local controls (model_runner/interface.py)

    def status(self):
        return {"status": "failed", "reason": "no weights here"}

    facts = None

    def health(self):
        return False, "model failed to load: no weights here"

    def describe_prompt(self, params):
        raise AssertionError("must not be reached")

    def add_end_listener(self, fn):  # every engine has one (model_runner/interface.py); nothing ends here
        pass


@pytest.fixture(scope="module")
def ready_engine():
    """Ready (a loaded fake model) with no worker thread: nothing ever runs, which HTTP never needs."""
    return Counting(Engine(EngineConfig(model="fake"), loaded=load("fake")))


def make_app(engine, **config):
    return create_app({"TESTING": True, "ENGINE": engine, **config})


@pytest.fixture
def client(ready_engine):
    ready_engine.calls = 0
    return make_app(ready_engine).test_client()


# ---- /api/model, /healthz -------------------------------------------------------------------


def test_model_reports_ready_with_the_facts_the_page_shows(client):
    body = client.get("/api/model").get_json()
    assert body["status"] == "ready" and body["reason"] is None
    assert {"name", "device_name", "dtype", "layers", "kv_heads", "head_dim", "context_window"} <= body["facts"].keys()
    assert body["limits"]["max_new_tokens"] == 1024


def test_model_reports_loading_without_facts():
    body = make_app(Engine(EngineConfig(model="fake"))).test_client().get("/api/model").get_json()
    assert body == {**body, "status": "loading", "facts": None}


def test_model_and_health_report_a_failed_load_with_its_reason():
    client = make_app(Unhealthy()).test_client()
    assert client.get("/api/model").get_json()["reason"] == "no weights here"
    health = client.get("/healthz")
    assert health.status_code == 503 and "no weights here" in health.get_json()["why"]


def test_health_is_200_while_the_worker_lives_and_503_when_it_is_gone(engine_factory):
    engine = engine_factory("fake")
    client = make_app(engine).test_client()
    assert client.get("/healthz").status_code == 200
    engine.shutdown()
    assert client.get("/healthz").status_code == 503


# ---- /api/prompt ------------------------------------------------------------------------------


def test_prompt_preview_gives_template_tokens_with_provenance_counts_and_budget(client):
    res = client.post("/api/prompt", json=CONVERSATION)
    body = res.get_json()
    assert res.status_code == 200
    assert "Be brief." in body["rendered"] and "Hi there" in body["rendered"]
    sources = {t["source"] for t in body["tokens"]}
    assert {"marker", "system", "user"} <= sources
    assert body["counts"]["total"] == len(body["tokens"]) == body["counts"]["content"] + body["counts"]["template"]
    assert body["budget"]["max_new_tokens"] == 16


@pytest.mark.parametrize(
    "payload, field",
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({**CONVERSATION, "max_new_tokens": 0}, "max_new_tokens"),
        ({**CONVERSATION, "sampling": {"top_k": 0}}, "sampling.top_k"),
    ],
)
def test_prompt_preview_names_the_bad_field(client, payload, field):
    res = client.post("/api/prompt", json=payload)
    assert res.status_code == 400
    assert res.get_json()["field"] == field and res.get_json()["code"] == "invalid_request"


def test_prompt_preview_refuses_a_prompt_past_the_window_under_reject(client):
    res = client.post("/api/prompt", json={"messages": [{"role": "user", "content": "x" * 600}]})
    assert res.status_code == 400 and res.get_json()["code"] == "context_overflow"


@pytest.mark.parametrize(
    "kwargs, code",
    [
        ({"data": "{not json", "content_type": "application/json"}, "invalid_json"),
        ({"data": '{"messages": "\\udc00"}', "content_type": "application/json"}, "invalid_json"),
        ({"data": "messages=hi", "content_type": "application/x-www-form-urlencoded"}, "invalid_json"),
    ],
)
def test_prompt_preview_refuses_a_body_that_is_not_a_json_object(client, kwargs, code):
    res = client.post("/api/prompt", **kwargs)
    assert res.status_code == 400 and res.get_json()["code"] == code


def test_prompt_preview_refuses_an_oversized_body(client):
    res = client.post("/api/prompt", json={"messages": [{"role": "user", "content": "x" * 300_000}]})
    assert res.status_code == 413 and res.get_json()["code"] == "too_large"


def test_prompt_preview_is_503_while_the_model_loads():
    res = make_app(Engine(EngineConfig(model="fake"))).test_client().post("/api/prompt", json=CONVERSATION)
    assert res.status_code == 503 and res.get_json()["code"] == "model_loading"


def test_prompt_preview_refuses_a_foreign_origin_before_model_work(client, ready_engine):
    res = client.post("/api/prompt", json=CONVERSATION, headers={"Origin": "https://evil.example"})
    assert res.status_code == 403 and ready_engine.calls == 0
    assert client.post("/api/prompt", json=CONVERSATION, headers={"Origin": "http://localhost"}).status_code == 200


# ---- the WebSocket handshake ------------------------------------------------------------------


@pytest.mark.parametrize(
    "origin", [None, "https://evil.example", "null", "http://localhost:9999", "http://localhost.evil.example"]
)
def test_ws_handshake_from_a_foreign_or_missing_origin_is_403_before_model_work(client, ready_engine, origin):
    headers = {**WS_UPGRADE, **({"Origin": origin} if origin else {})}
    res = client.get("/ws", headers=headers)
    assert res.status_code == 403 and ready_engine.calls == 0


def test_allowed_origins_extend_same_origin(ready_engine):
    client = make_app(ready_engine, ALLOWED_ORIGINS=["HTTP://Lab.Example:8000/"]).test_client()
    ok = client.post("/api/prompt", json=CONVERSATION, headers={"Origin": "http://lab.example:8000"})
    assert ok.status_code == 200
    assert client.post("/api/prompt", json=CONVERSATION, headers={"Origin": "http://lab.example"}).status_code == 403


@pytest.mark.parametrize(
    "origin, normal",
    [
        ("http://localhost:80", "http://localhost"),
        ("HTTPS://LOCALHOST:443/", "https://localhost"),
        ("http://[::1]:8000", "http://[::1]:8000"),
        ("null", None),
        ("file://", None),
        ("http://x/path", None),
        ("http://x:99999", None),
    ],
)
def test_origins_are_compared_in_normal_form(origin, normal):
    assert normalize_origin(origin) == normal


# ---- Host (DNS rebinding) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "host, status",
    [
        ("127.0.0.1:8000", 200),
        ("localhost:8000", 200),
        ("[::1]:8000", 200),
        ("LOCALHOST", 200),
        ("localhost:9000", 200),  # an ssh tunnel changes the port; a rebinding page cannot change the name
        ("evil.example:8000", 403),
        ("127.0.0.1.evil.example", 403),
        ("", 403),
        ("user@localhost", 403),
    ],
)
def test_loopback_server_answers_only_loopback_host_names(client, host, status):
    assert client.get("/api/model", headers={"Host": host}).status_code == status


def test_a_lan_bound_server_takes_any_host_unless_allowed_hosts_is_set(ready_engine):
    lan = make_app(ready_engine, BIND_HOST="0.0.0.0").test_client()
    assert lan.get("/api/model", headers={"Host": "192.168.1.20:8000"}).status_code == 200
    listed = make_app(ready_engine, BIND_HOST="0.0.0.0", ALLOWED_HOSTS=["kvscope.lan"]).test_client()
    assert listed.get("/api/model", headers={"Host": "kvscope.lan:8000"}).status_code == 200
    assert listed.get("/api/model", headers={"Host": "evil.example:8000"}).status_code == 403


def test_any_loopback_bind_address_turns_the_host_check_on(ready_engine):
    client = make_app(ready_engine, BIND_HOST="127.0.0.2").test_client()
    assert client.get("/api/model", headers={"Host": "127.0.0.2:8000"}).status_code == 200
    assert client.get("/api/model", headers={"Host": "evil.example:8000"}).status_code == 403


@pytest.mark.parametrize("host, parts", [("[::1]:8000", ("::1", 8000)), ("localhost", ("localhost", None))])
def test_split_host(host, parts):
    assert split_host(host) == parts


# ---- headers and the page ---------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/api/model", "/static/css/base.css", "/no-such-page"])
def test_every_response_carries_the_security_headers(client, path):
    headers = client.get(path).headers
    csp = headers["Content-Security-Policy"]
    for directive in (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
    ):
        assert directive in csp
    assert "unsafe-inline" not in csp
    assert headers["X-Content-Type-Options"] == "nosniff" and headers["Referrer-Policy"] == "no-referrer"


def test_the_api_is_never_cached(client):
    assert client.get("/api/model").headers["Cache-Control"] == "no-store"


def test_the_page_shell_renders_with_autoescape_on(client):
    res = client.get("/")
    assert res.status_code == 200 and b"Inside a streaming answer" in res.data
    assert client.application.jinja_env.autoescape("index.html")


# ---- configuration ------------------------------------------------------------------------------


def test_config_comes_from_defaults_then_environment_then_test_dict(monkeypatch, ready_engine):
    monkeypatch.setenv("KVSCOPE_ALLOWED_ORIGINS", '["http://a.example"]')
    monkeypatch.setenv("KVSCOPE_MAX_INFLIGHT_PER_SOCKET", "2")
    app = make_app(ready_engine, MAX_INFLIGHT_PER_SOCKET=3)
    assert app.config["ALLOWED_ORIGINS"] == ["http://a.example"]
    assert app.config["MAX_INFLIGHT_PER_SOCKET"] == 3
    assert app.config["SOCK_SERVER_OPTIONS"]["max_message_size"] >= 4 * 60_000
    assert app.extensions["kvscope_engine"] is ready_engine


# ---- the socket handler around the session ---------------------------------------------------


class ClosedSocket:
    """A socket whose client has already gone: the session ends at its first receive."""

    def __init__(self):
        self.closed_with = None

    def receive(self, timeout=None):
        from simple_websocket import ConnectionClosed

        raise ConnectionClosed(1000, "")

    def close(self, code=None, reason=None):
        self.closed_with = (code, reason)


def test_sockets_past_max_sockets_are_closed_with_1013_and_slots_come_back(ready_engine):
    from app.ws.routes import KEY, serve_socket

    app = make_app(ready_engine, MAX_SOCKETS=1)
    slots = app.extensions[KEY]
    with app.test_request_context("/ws"):
        with slots.take() as granted:
            assert granted
            refused = ClosedSocket()
            serve_socket(refused)
            assert refused.closed_with[0] == 1013
        served = ClosedSocket()
        serve_socket(served)  # the slot is free again: a session runs (and ends at once)
        assert served.closed_with is None and slots.open == 0


def test_a_send_to_a_client_that_stopped_reading_fails_instead_of_blocking_forever():
    import socket as socketlib
    from types import SimpleNamespace

    from app.ws.routes import bound_send_time

    server_end, client_end = socketlib.socketpair()
    ws = SimpleNamespace(sock=server_end)
    bound_send_time(ws, 0.2)
    with pytest.raises((BlockingIOError, TimeoutError)):
        for _ in range(10_000):  # the client never reads: the kernel buffers fill, then the send times out
            ws.sock.send(b"x" * 65536)
    server_end.close()
    client_end.close()


class RemoteLike(Counting):
    """The ready engine seen as a remote one: no local controls (model_runner/interface.py)."""

    local = None


def test_raw_completions_are_refused_by_name_on_a_remote_engine(ready_engine):
    engine = RemoteLike(ready_engine.engine)
    res = make_app(engine).test_client().post("/v1/completions", json={"prompt": "A KV cache is"})
    error = res.get_json()["error"]
    assert res.status_code == 400 and (error["code"], error["param"]) == ("not_supported", "prompt")
    assert "built-in engine" in error["message"]
    assert engine.calls == 0  # refused before any model work
