"""The WebSocket `generate` takes a `constraint` ({"kind", "spec"}, model_runner/protocol/constraint.py)
against a live server on the fake model: the answer is one of the choices and every token event carries
its step's mask; a regex xgrammar refuses, a misshapen spec, or `ignore_eos` beside a constraint is one
`error` event naming the field; an unconstrained request's tokens carry no mask."""

from __future__ import annotations

import json

import pytest
from kvscope_testkit import TERMINAL, generate_frame
from websockets.sync.client import connect

WAIT_S = 60.0  # a deadline for conditions that hold in well under a second; never a timing claim


def run(server, **fields) -> list[dict]:
    with connect(server.ws_url, origin=server.url, open_timeout=WAIT_S, close_timeout=5) as ws:
        ws.send(json.dumps(generate_frame("c1", sampling={"temperature": 0}, max_new_tokens=20, **fields)))
        events = [json.loads(ws.recv(timeout=WAIT_S))]
        while events[-1]["type"] not in TERMINAL:
            events.append(json.loads(ws.recv(timeout=WAIT_S)))
    return [e for e in events if e.get("request_id") == "c1"]


def test_a_choice_constraint_answers_one_choice_and_each_token_says_what_the_mask_allowed(fake_server):
    events = run(fake_server, constraint={"kind": "choice", "spec": ["red", "green", "blue"]})
    tokens = [e for e in events if e["type"] == "token"]
    assert events[-1]["type"] == "finished" and events[-1]["text"] in ("red", "green", "blue")
    assert tokens[0]["mask"] == {"allowed": 3, "first_allowed": False}  # r, g, b; the fake model wanted "H"
    assert all(t["mask"]["allowed"] >= 1 for t in tokens)


def test_an_unconstrained_request_has_no_mask(fake_server):
    assert all(e["mask"] is None for e in run(fake_server) if e["type"] == "token")


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"constraint": {"kind": "regex", "spec": "(["}}, "constraint.spec"),
        ({"constraint": {"kind": "choice", "spec": []}}, "constraint.spec"),
        ({"constraint": {"kind": "yaml"}}, "constraint.kind"),
        ({"constraint": {"kind": "json_object", "strict": True}}, "constraint.strict"),
        ({"constraint": {"kind": "json_object"}, "ignore_eos": True}, "ignore_eos"),
    ],
)
def test_a_constraint_it_cannot_run_is_one_error_naming_the_field(fake_server, fields, field):
    events = run(fake_server, **fields)
    assert [e["type"] for e in events] == ["error"] and events[0]["field"] == field, events
