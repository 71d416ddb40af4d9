"""Cases 6, 7, 9 and 12: what happens below the protocol — an oversized frame, a foreign page's
handshake, a TCP reset mid-stream, and a client that went silent without closing."""

from __future__ import annotations

import json
import os
import time

import pytest
from kvscope_testkit import (
    PING_INTERVAL_S,
    WAIT_S,
    Client,
    LogCursor,
    RawClient,
    browser_headers,
    close_code,
    end_is,
    generate_frame,
    server_holds_connection,
    terminals,
    wait_until,
)
from websockets.exceptions import ConnectionClosed, InvalidStatus


def test_06_an_oversized_frame_closes_that_socket_with_1009_and_others_keep_working(fake_server, figures):
    log = LogCursor(fake_server)
    bystander = Client(fake_server)
    big = Client(fake_server)
    frame = json.dumps(generate_frame("big", messages=[{"role": "user", "content": os.urandom(200_000).hex()}]))
    assert len(frame) > 256 * 1024
    big.send(frame)
    with pytest.raises(ConnectionClosed) as closed:
        big.ws.recv(timeout=WAIT_S)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    events = bystander.run("after", max_new_tokens=4)
    assert terminals(events)[0]["type"] == "finished"
    bystander.close()
    assert log.tracebacks() == []
    figures["06"] = {"frame_bytes": len(frame), "close_code": closed.value.rcvd.code, "bystander": "finished"}


def test_07_foreign_origin_missing_origin_and_rebinding_host_are_refused_at_the_handshake(fake_server, figures):
    log = LogCursor(fake_server)
    # A browser on another site: its own Origin.
    with pytest.raises(InvalidStatus) as foreign:
        Client(fake_server, origin="http://evil.example")
    assert foreign.value.response.status_code == 403
    assert json.loads(foreign.value.response.body)["code"] == "origin_not_allowed"
    # No Origin at all (every browser sends one; a script that omits it is not a page we served).
    no_origin = RawClient(fake_server.port, {"Host": f"127.0.0.1:{fake_server.port}"})
    assert no_origin.status == 403 and json.loads(no_origin.body)["code"] == "origin_required"
    # DNS rebinding: the attacker's name resolves to 127.0.0.1, so Host and Origin agree with each other.
    rebinding = RawClient(fake_server.port, browser_headers(fake_server, host=f"attacker.example:{fake_server.port}"))
    assert rebinding.status == 403 and json.loads(rebinding.body)["code"] == "bad_host"
    # The same raw handshake with our own names is accepted: the refusals above are the checks, not the client.
    ours = RawClient(fake_server.port, browser_headers(fake_server))
    assert ours.status == 101
    for raw in (no_origin, rebinding, ours):
        raw.close()
    assert log.ended() == {}, "no request may have reached the engine"
    figures["07"] = {"foreign_origin": 403, "no_origin": 403, "rebinding_host": 403, "own_origin": 101}


def test_09_a_tcp_reset_mid_stream_leaves_no_exception_and_the_queue_drains(slow_server, figures):
    log = LogCursor(slow_server)
    raw = RawClient(slow_server.port, browser_headers(slow_server))
    raw.send_text(json.dumps(generate_frame("reset-me", max_new_tokens=200)))
    raw.read_until("token", count=3)  # mid-stream: a few tokens are out before the reset
    raw.reset()
    how = log.wait_end("reset-me")
    assert end_is(how, "cancelled", cause="disconnect", state="decode"), how
    after = Client(slow_server)
    events = after.run("after-reset", max_new_tokens=3)
    after.close()
    queued = next(e for e in events if e["type"] == "queued")
    assert (queued["position"], queued["ahead"]) == (1, 0), "the reset request must not be in the way"
    assert terminals(events)[0]["type"] == "finished"
    assert log.tracebacks() == []
    figures["09"] = {"reset_request": how, "next_request": "finished, nothing ahead of it", "tracebacks_in_log": 0}


def test_12_a_half_open_client_is_closed_after_about_two_ping_intervals_and_freed(slow_server, figures):
    log = LogCursor(slow_server)
    raw = RawClient(slow_server.port, browser_headers(slow_server))
    opened = time.monotonic()
    # Long work (a 365-token prompt read one token per step): it cannot end before the pings do.
    raw.send_text(
        json.dumps(
            generate_frame(
                "silent", messages=[{"role": "user", "content": "long " * 60}], prefill_chunk=1, max_new_tokens=8
            )
        )
    )
    # From here the client neither reads nor answers pings; the server must notice on its own.
    assert server_holds_connection(slow_server, raw.local_port)
    wait_until(
        lambda: not server_holds_connection(slow_server, raw.local_port),
        "the server to release the half-open connection",
        timeout=10 * PING_INTERVAL_S + WAIT_S,
    )
    released_s = time.monotonic() - opened
    frames, closed = raw.read_frames(5)
    raw.close()
    assert closed and close_code(frames) == 1008, "the server closes with 1008 (ping/pong timeout)"
    assert any(opcode == 0x9 for opcode, _ in frames), "the server pinged first"
    how = log.wait_end("silent")
    assert end_is(how, "cancelled", cause="disconnect"), how
    assert 1.0 * PING_INTERVAL_S <= released_s
    figures["12"] = {
        "ping_interval_s": PING_INTERVAL_S,
        "released_after_s": round(released_s, 2),
        "close_code": 1008,
        "request": how,
    }
