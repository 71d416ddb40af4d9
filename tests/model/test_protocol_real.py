"""The protocol end to end with the real default model (SmolLM2-135M-Instruct) behind gunicorn:
one full generate and one cancel, as the page does them."""

from __future__ import annotations

import json

from kvscope_testkit import TERMINAL
from websockets.sync.client import connect

WAIT_S = 120.0
ASK = [{"role": "user", "content": "What is the capital of France?"}]


def events_of(ws, rid):
    events = []
    while not events or events[-1]["type"] not in TERMINAL:
        event = json.loads(ws.recv(timeout=WAIT_S))
        assert event["request_id"] == rid
        events.append(event)
        yield event


def test_real_model_streams_a_greedy_answer_with_measured_cache_growth(real_server):
    with connect(real_server.ws_url, origin=real_server.url, open_timeout=WAIT_S) as ws:
        ws.send(json.dumps({"type": "generate", "request_id": "real-1", "messages": ASK, "max_new_tokens": 12}))
        events = list(events_of(ws, "real-1"))
    end = events[-1]
    assert end["type"] == "finished" and end["reason"] in ("eos", "max_tokens")
    assert "Paris" in end["text"]
    tokens = [e for e in events if e["type"] == "token"]
    assert "".join(t["text"] for t in tokens) == end["text"]
    accepted = events[0]
    assert accepted["type"] == "accepted" and accepted["context_window"] == 8192
    grown = [t["cache_tokens"] for t in tokens]
    assert grown == list(range(grown[0], grown[0] + len(grown)))  # one more cached position per token
    assert all(t["cache_bytes_measured"] == t["cache_bytes_formula"] for t in tokens)


def test_real_model_cancel_mid_answer_returns_the_partial_text(real_server):
    with connect(real_server.ws_url, origin=real_server.url, open_timeout=WAIT_S) as ws:
        ws.send(
            json.dumps(
                {
                    "type": "generate",
                    "request_id": "real-c",
                    "max_new_tokens": 400,
                    "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
                }
            )
        )
        for event in events_of(ws, "real-c"):
            if event["type"] == "token":
                ws.send(json.dumps({"type": "cancel", "request_id": "real-c"}))
                break
        end = [e for e in events_of(ws, "real-c")][-1]
    assert (end["type"], end["cause"], end["state"]) == ("cancelled", "client", "decode")
    assert 1 <= end["tokens"] < 400
