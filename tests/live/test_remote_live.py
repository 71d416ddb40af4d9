"""`kvscope serve --engine openai:URL` in front of a second kvscope (the fake model, 30 ms a step):
a WebSocket generate through the proxy gives the same greedy text as asking the backend directly, a
cancel at the proxy closes the upstream stream (the backend logs the request cancelled), and
`--api-key` guards /v1 without ever printing the key."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from kvscope_testkit import Client, LogCursor, end_is, wait_until
from playwright.sync_api import expect

KEY = "kvscope-test-key-5f1e"


@pytest.fixture(scope="module")
def proxy(live_server, slow_server):
    return live_server("fake", args=("--engine", f"openai:{slow_server.url}"))


@pytest.mark.parametrize(
    "args, words",
    [
        (["--engine", "ftp://gpu:8000"], "--engine must be openai:http://HOST:PORT"),
        (["--engine-model", "m"], "--engine-model and --engine-config need --engine openai:URL"),
        (["--engine", "openai:http://127.0.0.1:9", "--engine-config", "/no/such/config"], "no such config.json"),
    ],
)
def test_bad_engine_arguments_give_one_line(args, words):
    result = subprocess.run(
        [sys.executable, "-m", "kvscope.cli", "serve", *args], capture_output=True, text=True, timeout=60
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and words in lines[0], result.stderr


def get(url: str, headers: dict | None = None) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def test_the_proxy_serves_the_backends_model(proxy, slow_server):
    status, model = get(proxy.url + "/api/model")
    assert status == 200 and model["status"] == "ready"
    backend_name = get(slow_server.url + "/v1/models")[1]["data"][0]["id"]
    assert model["facts"]["name"] == backend_name and model["facts"]["engine"] == "openai"
    assert model["facts"]["kv_bytes_per_token"] is None  # no --engine-config: not invented
    assert "starting" not in proxy.log() and "the model runs on the remote server" in proxy.log()


def test_greedy_text_through_the_proxy_equals_the_backends(proxy, slow_server):
    direct, relayed = Client(slow_server), Client(proxy)
    try:
        want = direct.run("d", max_new_tokens=12)[-1]
        got = relayed.run("p", max_new_tokens=12)
    finally:
        direct.close()
        relayed.close()
    end = got[-1]
    assert want["type"] == "finished" and end["type"] == "finished", (want, end)
    assert end["text"] == want["text"] and end["tokens"] == want["tokens"]
    tokens = [e for e in got if e["type"] == "token"]
    assert "".join(t["text"] for t in tokens) == want["text"]
    assert all(t["kv_blocks"] is None and t["cache_bytes_measured"] is None for t in tokens)
    assert end["metrics"]["ttft_ms"] > 0 and end["metrics"]["queue_ms"] is None


def test_cancel_at_the_proxy_cancels_upstream(proxy, slow_server):
    backend = LogCursor(slow_server)
    client = Client(proxy)
    try:
        client.generate("c", max_new_tokens=400)  # 12 s of fake steps: only a cancel ends it early
        client.wait_type("c", "token")
        client.cancel("c")
        end = client.wait("c")[-1]
    finally:
        client.close()
    assert end["type"] == "cancelled" and end["cause"] == "client"
    ends = wait_until(
        lambda: [e for e in backend.events("request_ended") if e["request_id"].startswith("chatcmpl-")],
        "the backend's end",
    )
    assert end_is(ends[-1], "cancelled", cause="disconnect"), ends
    assert ends[-1]["tokens"] < 400


def test_non_streaming_client_that_hangs_up_is_cancelled(slow_server):
    backend = LogCursor(slow_server)
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 400, "temperature": 0})
    host, port = "127.0.0.1", slow_server.port
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.sendall(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
        )
        time.sleep(0.5)
    ends = wait_until(
        lambda: [e for e in backend.events("request_ended") if e["request_id"].startswith("chatcmpl-")], "the end"
    )
    assert end_is(ends[-1], "cancelled", cause="disconnect"), ends
    assert ends[-1]["tokens"] < 400


def test_api_key_guards_v1_and_is_never_printed(live_server):
    server = live_server("fake", args=("--api-key", KEY))
    status, body = get(server.url + "/v1/models")
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    assert get(server.url + "/v1/models", {"Authorization": "Bearer wrong"})[0] == 401
    assert get(server.url + "/v1/models", {"Authorization": f"Bearer {KEY}"})[0] == 200
    assert get(server.url + "/api/model")[0] == 200  # the page's own API is not the OpenAI API
    log = server.log()
    assert "requires `Authorization: Bearer <API key>`" in log and KEY not in log


@pytest.fixture
def ignored_console_errors():
    """The favicon probe, and /api/prompt's 400 `not_visible` (no local tokenizer) that the lab shows."""
    return ("/favicon.ico", "status of 400")


def test_the_page_says_what_is_not_visible_from_outside(proxy, page, console_errors):
    page.goto(proxy.url + "/")
    expect(page.locator('#model-status[data-status="ready"]')).to_be_attached(timeout=60_000)
    expect(page.locator("#lab-counts")).to_contain_text("not visible from outside the remote server")
    page.locator("#lab").scroll_into_view_if_needed()
    page.fill("#lab-max-new", "12")
    page.click("#lab-run")
    expect(page.locator('#lab-status[data-status="finished"]')).to_be_attached(timeout=60_000)
    expect(page.locator('#lab-metrics [data-metric="queue"] dd').first).to_have_text(
        "not visible from outside the server"
    )
    assert page.locator('#lab-metrics [data-metric="ttft"] dd').first.inner_text().endswith("ms")  # measured at kvscope
    page.locator(".wt-run").click()
    expect(page.locator(".wt-end")).to_be_visible(timeout=60_000)
    expect(page.locator(".wt-timeline-legend")).to_contain_text(
        "queue and prefill: not visible from outside the server"
    )
    assert console_errors == []
