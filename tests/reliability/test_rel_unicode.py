"""Case 20: text survives the round trip — emoji (one split across four byte tokens), CJK,
right-to-left scripts and combining marks reach the model unchanged and come back without a
U+FFFD, and a 10,000-character prompt arrives whole (on the real model: the fake one's window is 512)."""

from __future__ import annotations

import json
import urllib.request

from kvscope_testkit import Client, terminals

from model_runner.loading.fake import ANSWER

MIXED = "Emoji 😀🧠👩‍👩‍👧, CJK 注意力と東京, RTL שלום עולם / مرحبا بالعالم, combining e\u0301."
UNIT = "Caches keep keys 😀 and values 注意 for later, שלום مرحبا. "


def describe(server, messages) -> dict:
    body = json.dumps({"messages": messages, "max_new_tokens": 4}, ensure_ascii=False).encode()
    request = urllib.request.Request(
        server.url + "/api/prompt", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.load(r)


def texts_of(events: list[dict]) -> list[str]:
    return [e["text"] for e in events if "text" in e] + [e["message"] for e in events if "message" in e]


def assert_stream_intact(events: list[dict]) -> str:
    """The token texts join up to the final text, with no replacement character anywhere."""
    end = terminals(events)[0]
    assert end["type"] == "finished", end
    tokens = [e for e in events if e["type"] == "token"]
    assert "".join(t["text"] for t in tokens) == end["text"]
    assert not any("\ufffd" in t for t in texts_of(events))
    assert all(t["text"] == "" for t in tokens if t["pending"]), "a pending token releases no text"
    return end["text"]


def test_20_unicode_and_a_10000_character_prompt_arrive_intact(fake_server, real_engine, inprocess_server, figures):
    # Fake model, live gunicorn server: the prompt as rendered holds the text byte for byte, and the
    # answer's emoji (four byte tokens, three of them pending) arrives whole.
    messages = [{"role": "system", "content": MIXED}, {"role": "user", "content": MIXED}]
    view = describe(fake_server, messages)
    assert view["rendered"].count(MIXED) == 2 and "\ufffd" not in view["rendered"]
    client = Client(fake_server)
    events = client.run("mixed", messages=messages)
    client.close()
    assert events[0]["prompt_tokens"] == view["counts"]["total"]
    assert assert_stream_intact(events) == ANSWER
    pending = sum(e["pending"] for e in events if e["type"] == "token")
    assert pending == 3

    # Real model, in-process server: a 10,000-character prompt in mixed scripts, over the socket.
    server = inprocess_server(real_engine)
    long_text = (UNIT * (10_000 // len(UNIT) + 1))[:10_000]
    long_messages = [{"role": "user", "content": long_text}]
    long_view = describe(server, long_messages)
    assert long_text in long_view["rendered"] and "\ufffd" not in long_view["rendered"]
    client = Client(server)
    client.generate("long", messages=long_messages, prefill_chunk=256, max_new_tokens=4)
    accepted = client.wait_type("long", "accepted")
    assert accepted["prompt_tokens"] == long_view["counts"]["total"]
    client.cancel("long")  # the point is the prompt's arrival; a full prefill would cost ~a minute of CPU
    assert terminals(client.wait("long"))[0]["type"] in ("cancelled", "finished")
    # ...and the real model's own multi-byte output streams back whole.
    reply = client.run(
        "reply",
        messages=[{"role": "user", "content": "Write the word 東京 and the emoji 😀, nothing else."}],
        max_new_tokens=16,
    )
    client.close()
    reply_text = assert_stream_intact(reply)
    figures["20"] = {
        "fake_prompt_tokens": events[0]["prompt_tokens"],
        "fake_pending_tokens": pending,
        "long_prompt_chars": len(long_text),
        "long_prompt_tokens": accepted["prompt_tokens"],
        "real_reply": reply_text,
        "replacement_characters": 0,
    }
