"""The room without Flask (app/classroom/room.py): built on an engine alone, it counts ends through the engine's
end listener and computes the class stats with the one p50/p95 (model_runner/protocol/metrics.py); on a
remote engine (`engine.local` is None) pause is refused by name and tokens/s is unknown, while the
other settings still work."""

from __future__ import annotations

import pytest

from app.classroom.room import STATS_WINDOW_S, Room
from model_runner.protocol.errors import UserError
from model_runner.protocol.metrics import p50_p95

pytestmark = pytest.mark.unit


class RemoteLike:
    """The members of the engine interface the room uses, as a remote engine has them: no local controls."""

    local = None

    def __init__(self):
        self.listeners = []
        self.cancelled_with = []

    def add_end_listener(self, fn):
        self.listeners.append(fn)

    def snapshot(self):
        return {"waiting": None, "running": None, "policy": {}}

    def cancel_all(self, cause):
        self.cancelled_with.append(cause)
        return 2

    def end(self, kind, **metrics):
        for fn in self.listeners:
            fn(None, {"type": kind, "metrics": metrics})


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_a_room_needs_no_flask_and_counts_ends_through_the_engines_listener():
    engine, clock = RemoteLike(), Clock()
    room = Room(engine, class_mode=True, per_laptop_cap=4, clock=clock)
    assert len(engine.listeners) == 1
    for ttft, tpot in ((100.0, 10.0), (300.0, None), (200.0, 30.0)):
        engine.end("finished", ttft_ms=ttft, tpot_ms=tpot)
    engine.end("cancelled")
    engine.end("error")
    stats = room.stats()
    assert (stats["finished"], stats["cancelled"], stats["errors"]) == (3, 1, 1)
    assert stats["ttft_ms"] == p50_p95([100.0, 300.0, 200.0]) == {"p50": 200.0, "p95": 290.0, "n": 3}
    assert stats["tpot_ms"] == {"p50": 20.0, "p95": 29.0, "n": 2}  # the end without a TPOT is not counted
    clock.now += STATS_WINDOW_S + 1  # a minute later the percentiles forget them; the counts stay
    later = room.stats()
    assert later["ttft_ms"] == {"p50": None, "p95": None, "n": 0} and later["finished"] == 3


def test_on_a_remote_engine_pause_is_refused_by_name_and_tokens_per_s_is_unknown():
    engine = RemoteLike()
    room = Room(engine, class_mode=True, per_laptop_cap=4)
    with pytest.raises(UserError) as refused:
        room.update({"paused": True})
    assert refused.value.field == "paused" and "remote engine" in refused.value.message
    assert room.current().paused is False
    assert room.update({"show_prompts": True, "per_laptop_cap": 2}).per_laptop_cap == 2
    assert room.update({"show_prompts": False}).show_prompts is False  # nothing local to withdraw
    stats = room.stats()
    assert stats["tokens_per_s"] is None and stats["waiting"] is None
    assert room.cancel_all() == 2 and engine.cancelled_with == ["teacher"]
