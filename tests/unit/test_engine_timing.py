"""The engine's clocks as users read them: queue + prefill = TTFT on the engine's own stamps (the
`prefill_start` event, the metrics and the feed's `waited_ms` agree), a request cancelled while
queued has only queue time, and docs/protocol.md says where each clock starts and stops."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import model_runner.local.postprocess as postprocess
from model_runner.protocol.request import parse_generate

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = ROOT / "docs" / "protocol.md"
HELLO = [{"role": "user", "content": "Tell me about caches."}]


def run_all(engine, params, request_id="r"):
    return [e.to_dict() for e in engine.submit(params, request_id)]


def test_queue_prefill_and_ttft_tile_the_request_on_the_engines_own_stamps(engine_factory, monkeypatch):
    engine = engine_factory("fake")
    make_generator = postprocess.make_generator

    def slow_set_up(*args, **kwargs):  # per-request set-up made visible: 20 ms between admission and work
        time.sleep(0.02)
        return make_generator(*args, **kwargs)

    monkeypatch.setattr(postprocess, "make_generator", slow_set_up)
    feed = engine.feed.subscribe(capacity=10_000)
    events = run_all(engine, parse_generate({"messages": HELLO, "max_new_tokens": 6}))
    admit = next(e for e in iter(lambda: feed.next_event(5), None) if e["type"] == "engine_admit")
    by_type = {e["type"]: e for e in events}
    m = events[-1]["metrics"]
    assert by_type["prefill_start"]["t_ms"] == pytest.approx(m["queue_ms"], abs=0.0015), (
        "prefill_start must carry the stamp queue_ms ends at, not a later clock reading"
    )
    assert m["queue_ms"] + m["prefill_ms"] == pytest.approx(m["ttft_ms"], abs=1e-6)
    assert by_type["prefill_end"]["t_ms"] == pytest.approx(m["ttft_ms"], abs=0.0015)
    assert by_type["prefill_end"]["ms"] == pytest.approx(m["prefill_ms"], abs=0.003)
    assert m["prefill_ms"] >= 20  # the set-up is inside prefill, not lost between the phases
    assert admit["waited_ms"] == pytest.approx(m["queue_ms"], abs=0.0015)  # the feed's wait is the same queue


def test_a_request_cancelled_while_queued_has_only_queue_time():
    from model_runner.protocol.metrics import request_metrics
    from model_runner.shared.sequence import Sequence

    seq = Sequence(id="q", params=parse_generate({"messages": HELLO}), submitted_at=100.0)
    m = request_metrics(seq, 100.25)
    assert m["queue_ms"] == m["e2e_ms"] == 250.0 and m["prefill_ms"] is None and m["ttft_ms"] is None


def test_protocol_doc_says_where_each_clock_starts_and_stops():
    text = PROTOCOL.read_text()
    section = text.split("### Timing metrics", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    for phrase in ("after", "tokeniz", "template", "arrival", "queue_ms + prefill_ms = ttft_ms", "prefill_start"):
        assert phrase in section, phrase
