"""Cases 1–5: odd input over a live socket gets an in-band `error` naming the field and its limit,
and the socket stays usable; the context budget is exact at the window's edge."""

from __future__ import annotations

import json
import urllib.request

import pytest
from kvscope_testkit import Client, LogCursor, terminals

USER = {"role": "user", "content": "Say hello."}


@pytest.fixture
def client(fake_server):
    c = Client(fake_server)
    yield c
    c.close()


def still_usable(client: Client, rid: str) -> None:
    """The socket still serves a normal request after the errors."""
    events = client.run(rid, max_new_tokens=2)
    assert [e["type"] for e in terminals(events)] == ["finished"]


def refusal(client: Client, rid: str, **fields) -> dict:
    """The one event answering a generate that must be refused: an error, nothing before it."""
    events = client.run(rid, **fields)
    assert len(events) == 1, f"a refused request must get only its error, got {[e['type'] for e in events]}"
    return events[0]


def test_01_bad_messages_get_an_error_and_the_socket_stays_usable(client, figures):
    cases = {
        "empty": ([], "messages"),
        "role": ([{"role": "wizard", "content": "hi"}], "messages[0].role"),
        "nocontent": ([{"role": "user"}], "messages[0].content"),
        "notlist": ("hello", "messages"),
        "lastnotuser": ([USER, {"role": "assistant", "content": "Hi!"}], "messages[1]"),
        "blankuser": ([{"role": "user", "content": "   "}], "messages[0]"),
    }
    for rid, (messages, field) in cases.items():
        error = refusal(client, rid, messages=messages)
        assert (error["type"], error["code"], error["field"]) == ("error", "invalid_request", field), error
        assert error["message"].startswith(f"`{field.split('.')[0].split('[')[0]}")
    still_usable(client, "after")
    figures["01"] = {"refused": len(cases), "socket_usable_after": True}


def test_02_undecodable_frames_get_an_error_and_no_traceback(fake_server, client, figures):
    log = LogCursor(fake_server)
    frames = {
        "{not json": "not valid JSON",
        b"\x00\x01binary": "binary frames",
        "[1, 2, 3]": "JSON object",
        '{"type": "generate", "x": "\\ud800"}': "unpaired surrogate",
        "[" * 50_000 + "]" * 50_000: "nested too deeply",
    }
    for frame, says in frames.items():
        error = client.error_for_frame(frame)
        assert (error["type"], error["code"], error["request_id"]) == ("error", "invalid_json", None)
        assert says in error["message"]
    for kind in ("launch", None, 7):
        error = client.error_for_frame(json.dumps({"type": kind, "request_id": "x"}))
        assert (error["code"], error["field"]) == ("invalid_request", "type")
    still_usable(client, "after")
    assert log.tracebacks() == []
    figures["02"] = {"frames_refused": len(frames) + 3, "tracebacks_in_log": 0}


@pytest.mark.parametrize("value", [0, -1, "10", 10**9, 2.5, True])
def test_03_max_new_tokens_out_of_range_names_the_field_and_range(client, value):
    error = refusal(client, "r", max_new_tokens=value)
    assert (error["code"], error["field"]) == ("invalid_request", "max_new_tokens")
    assert "between 1 and 1024" in error["message"]
    still_usable(client, "after")


SAMPLING_CASES = [
    ({"sampling": {"temperature": -0.5}}, "sampling.temperature", "between 0 and 2"),
    ({"sampling": {"temperature": float("nan")}}, "sampling.temperature", "between 0 and 2"),
    ({"sampling": {"temperature": float("inf")}}, "sampling.temperature", "between 0 and 2"),
    ({"sampling": {"top_p": 0}}, "sampling.top_p", "(0, 1]"),
    ({"sampling": {"top_p": 1.01}}, "sampling.top_p", "(0, 1]"),
    ({"sampling": {"top_k": 0}}, "sampling.top_k", "between 1 and 1000"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
    ({"stop": ["x" * 65]}, "stop", "1 to 64"),
    ({"stop": [""]}, "stop", "1 to 64"),
    ({"stop": "\n"}, "stop", "list of strings"),
]


@pytest.mark.parametrize(
    "fields, field, says", SAMPLING_CASES, ids=[f"{c[1]}-{i}" for i, c in enumerate(SAMPLING_CASES)]
)
def test_04_sampling_and_stop_out_of_range_name_the_field(client, fields, field, says):
    error = refusal(client, "r", **fields)  # json.dumps writes NaN/Infinity literals, as a sloppy client would
    assert (error["code"], error["field"]) == ("invalid_request", field)
    assert says in error["message"]
    still_usable(client, "after")


def prompt_tokens(server, messages) -> int:
    body = json.dumps({"messages": messages, "max_new_tokens": 1}).encode()
    request = urllib.request.Request(
        server.url + "/api/prompt", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.load(r)["counts"]["total"]


def accepted_then_cancelled(client: Client, rid: str, **fields) -> dict:
    """Run a request only until it is accepted (the budget decision), then cancel it."""
    client.generate(rid, **fields)
    first = client.wait(rid, lambda evs: bool(evs))[0]
    if first["type"] == "accepted":
        client.cancel(rid)
        client.wait(rid)
    return first


def test_05_context_budget_is_exact_at_the_window_edge_and_each_policy_does_what_it_says(fake_server, client, figures):
    window = 512  # the fake model's context window
    messages = [USER]
    prompt = prompt_tokens(fake_server, messages)

    fits = accepted_then_cancelled(client, "edge", messages=messages, max_new_tokens=window - prompt)
    assert fits["type"] == "accepted" and fits["budget"]["total"] == window and fits["budget"]["action"] == "none"

    over = accepted_then_cancelled(client, "over", messages=messages, max_new_tokens=window - prompt + 1)
    assert (over["type"], over["code"], over["field"]) == ("error", "context_overflow", "max_new_tokens")
    assert (
        f"prompt {prompt} + max_new_tokens {window - prompt + 1} = {window + 1} > context window {window}"
        in over["message"]
    )

    shrunk = accepted_then_cancelled(client, "shrink", messages=messages, max_new_tokens=1024, overflow="shrink_output")
    assert shrunk["type"] == "accepted"
    assert shrunk["budget"]["action"] == "shrunk_output" and shrunk["max_new_tokens"] == window - prompt
    assert shrunk["budget"]["requested_max_new_tokens"] == 1024

    history = [
        {"role": "user", "content": "An earlier question. " * 10},
        {"role": "assistant", "content": "An earlier answer. " * 10},
        USER,
    ]
    full = prompt_tokens(fake_server, history)
    truncated = accepted_then_cancelled(
        client, "truncate", messages=history, max_new_tokens=window - prompt, overflow="truncate_history"
    )
    assert full + window - prompt > window and truncated["type"] == "accepted"
    assert truncated["budget"]["action"] == "truncated_history" and truncated["budget"]["dropped_messages"] == 2
    assert truncated["prompt_tokens"] == prompt and truncated["max_new_tokens"] == window - prompt

    too_long = [{"role": "user", "content": "x" * (window + 10)}]
    for policy in ("truncate_history", "shrink_output"):  # nothing left to drop or shrink: still refused
        error = accepted_then_cancelled(client, f"nofit-{policy}", messages=too_long, overflow=policy)
        assert (error["type"], error["code"]) == ("error", "context_overflow")

    still_usable(client, "after")
    figures["05"] = {
        "context_window": window,
        "prompt_tokens": prompt,
        "accepted_total": window,
        "refused_total": window + 1,
        "shrunk_to": window - prompt,
        "dropped_messages": 2,
    }
