"""The classroom itself, without Flask: the teacher's `Settings`, the `Room` (its open sockets, the
laptops they belong to, pause and cancel-all through the engine, the class counters) and each
WebSocket's `Seat` (its "laptop N" label, the per-laptop cap and rate limit, notices, follow-me)."""

from __future__ import annotations

import itertools
import logging
import re
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

from model_runner.protocol.errors import UserError
from model_runner.protocol.fields import check_bool, check_int, json_repr
from model_runner.protocol.metrics import p50_p95

log = logging.getLogger(__name__)

CANCEL_CAUSE = "teacher"  # the `cause` of every request the teacher's cancel-all ends
STATS_WINDOW_S = 60  # TTFT and TPOT percentiles over requests that ended this recently
RATE_WINDOW_S = 10  # aggregate tokens/s over this many seconds
TICK_S = 1.0  # how often `class_stats` goes to every subscriber
LIMITS = {"per_laptop_cap": (1, 32), "rate_per_min": (1, 600)}
STAGE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}\Z")


@dataclass
class Settings:
    paused: bool = False
    show_prompts: bool = False
    per_laptop_cap: int = 4
    rate_per_min: int | None = None
    follow_stage: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_settings(changes: dict, current: Settings) -> Settings:
    """The settings with `changes` applied; UserError naming the field and its limit when one is bad."""
    out = Settings(**current.to_dict())
    for name, value in changes.items():
        _check_setting(name, value)
        setattr(out, name, value)
    return out


def _check_setting(name: str, value: Any) -> None:
    if name in ("paused", "show_prompts"):
        check_bool(name, value)
    elif name in LIMITS:
        if not (name == "rate_per_min" and value is None):  # null: no rate limit
            check_int(name, value, *LIMITS[name], or_else=" or null (no limit)" if name == "rate_per_min" else "")
    else:
        known = ", ".join(n for n in Settings.__dataclass_fields__ if n != "follow_stage")
        raise UserError(f"`{name}` is not a class setting; known: {known}", field=name)


class Room:
    """The class: its settings, the open sockets (seats) and the counters it reports. The engine
    stays the owner of requests: pausing and cancelling go through its own methods."""

    def __init__(self, engine, *, class_mode: bool, per_laptop_cap: int, clock: Callable[[], float] = time.monotonic):
        self.engine = engine
        self.class_mode = class_mode
        self.settings = Settings(per_laptop_cap=per_laptop_cap)
        self.clock = clock
        self.lock = threading.Lock()  # guards the seats, the laptops and the counters
        self._settings_lock = threading.Lock()
        self._seats: list[Seat] = []
        self._laptops: dict[str, Laptop] = {}  # cookie id → laptop, for the server's life
        self._numbers = itertools.count(1)
        self.counts = {"finished": 0, "cancelled": 0, "errors": 0}
        self._ends: deque[tuple[float, float | None, float | None]] = deque()  # (at, ttft_ms, tpot_ms)
        self._samples: deque[tuple[float, int]] = deque()  # (at, tokens generated so far)
        self._ticker: threading.Thread | None = None
        engine.add_end_listener(self._on_end)

    # ---- seats ---------------------------------------------------------------------------------

    def seat(self, teacher: bool, laptop_id: str | None = None) -> Seat:
        """A socket joins. Sockets from one browser (its `kvscope_laptop` cookie) share one laptop: one
        label, one rate limit and one in-flight cap, though the page opens a socket per request; a
        socket without the cookie (a script, the class simulator) is a laptop of its own."""
        with self.lock:
            laptop = self._laptops.get(laptop_id) if laptop_id else None
            if laptop is None:
                laptop = Laptop(next(self._numbers))
                if laptop_id:
                    self._laptops[laptop_id] = laptop
            seat = Seat(self, laptop, teacher)
            self._seats.append(seat)
        self.publish_state()
        return seat

    def leave(self, seat: Seat) -> None:
        with self.lock:
            if seat in self._seats:
                self._seats.remove(seat)
        self.publish_state()

    @property
    def laptops(self) -> int:
        """Students' laptops with the page open: those with a socket that does not carry the teacher's key."""
        with self.lock:
            return len({id(s.laptop) for s in self._seats if not s.teacher})

    def current(self) -> Settings:
        """The settings in force; `paused` is the engine's own flag where the engine has one."""
        local = self.engine.local
        paused = local.paused if local is not None else self.settings.paused
        return replace(self.settings, paused=bool(paused))

    def state_event(self) -> dict[str, Any]:
        return {"type": "class_state", "laptops": self.laptops, "settings": self.current().to_dict()}

    def publish_state(self) -> None:
        """class_state to every feed subscriber, in its feed buffer (never blocking this thread)."""
        event = self.state_event()
        for seat in self._subscribed():
            seat.offer(event)

    def _subscribed(self) -> list[Seat]:
        with self.lock:
            return [s for s in self._seats if s.feed is not None]

    def _broadcast(self, message: dict, seats: list[Seat]) -> None:
        """Send a message to sockets on a thread of its own: a stuck student never holds the teacher."""
        if seats:
            threading.Thread(target=lambda: [s.send(message) for s in seats], name="kvscope-class", daemon=True).start()

    # ---- the teacher's controls ----------------------------------------------------------------------

    def update(self, changes: dict) -> Settings:
        local = self.engine.local
        if "paused" in changes and local is None:
            raise UserError("this engine cannot hold admissions (a remote engine schedules itself)", field="paused")
        with self._settings_lock:  # two teacher tabs at once: each change applies whole
            new = parse_settings(changes, self.current())
            old, self.settings = self.settings, new
            if "paused" in changes:
                local.set_paused(new.paused)
        if old.show_prompts and not new.show_prompts and local is not None:
            local.withdraw_feed_text()
        if new.show_prompts != old.show_prompts:
            with self.lock:
                seats = list(self._seats)
            self._broadcast({"type": "class_notice", "show_prompts": new.show_prompts}, seats)
        log.info("class: the teacher changed %s", ", ".join(sorted(changes)) or "nothing")
        self.publish_state()
        return self.current()

    def set_stage(self, stage: Any) -> str:
        if not isinstance(stage, str) or not STAGE_RE.match(stage):
            raise UserError(
                f"`stage` must be a walkthrough stage id: 1 to 64 characters of A-Z a-z 0-9 _ . : -, got {json_repr(stage)}",
                field="stage",
            )
        with self._settings_lock:
            self.settings = replace(self.settings, follow_stage=stage)
        with self.lock:
            followers = [s for s in self._seats if s.following]
        self._broadcast({"type": "class_stage", "stage": stage}, followers)
        self.publish_state()
        return stage

    def cancel_all(self) -> int:
        count = self.engine.cancel_all(CANCEL_CAUSE)
        log.info("class: the teacher cancelled %d requests", count)
        return count

    # ---- counters --------------------------------------------------------------------------------

    def _on_end(self, seq, terminal: dict) -> None:
        """The engine's end listener (engine lock held): count the end, keep its TTFT and TPOT."""
        kind = terminal.get("type")
        metrics = terminal.get("metrics") or {}
        counter = "errors" if kind == "error" else kind
        with self.lock:
            self.counts[counter] = self.counts.get(counter, 0) + 1
            self._ends.append((self.clock(), metrics.get("ttft_ms"), metrics.get("tpot_ms")))

    def stats(self) -> dict[str, Any]:
        """The class counters now: the engine's queue, ends so far, TTFT/TPOT percentiles over the
        last minute (the engine's per-request metrics, as the lab shows them) and tokens/s."""
        now = self.clock()
        snapshot = self.engine.snapshot()
        with self.lock:
            while self._ends and self._ends[0][0] < now - STATS_WINDOW_S:
                self._ends.popleft()
            ttft = [t for _, t, _ in self._ends]
            tpot = [t for _, _, t in self._ends]
            counts = dict(self.counts)
        return {
            "type": "class_stats",
            "waiting": snapshot.get("waiting"),  # None: a remote engine without /metrics cannot say
            "running": snapshot.get("running"),
            **counts,
            "tokens_per_s": self._tokens_per_s(now),
            "ttft_ms": p50_p95(ttft),
            "tpot_ms": p50_p95(tpot),
            "window_s": STATS_WINDOW_S,
        }

    def _tokens_per_s(self, now: float) -> float | None:
        """Tokens the engine chose in the last RATE_WINDOW_S seconds (less until that much history
        exists), per second; None for a remote engine, which does not count them."""
        local = self.engine.local
        if local is None:
            return None
        with self.lock:
            self._samples.append((now, local.tokens_generated))
            while len(self._samples) > 1 and self._samples[1][0] <= now - RATE_WINDOW_S:
                self._samples.popleft()
            (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        return round((n1 - n0) / (t1 - t0), 3) if t1 > t0 else 0.0

    # ---- the once-a-second ticker -------------------------------------------------------------------

    def start_ticker(self) -> None:
        with self.lock:
            if self._ticker is not None and self._ticker.is_alive():
                return
            self._ticker = threading.Thread(target=self._tick, name="kvscope-class-stats", daemon=True)
            self._ticker.start()

    def _tick(self) -> None:
        """class_stats to every subscriber once a second, while any is subscribed."""
        while True:
            with self.lock:  # under the lock: a seat subscribing now either is seen or starts a new ticker
                seats = [s for s in self._seats if s.feed is not None]
                if not seats:
                    self._ticker = None
                    return
            try:
                common = self.stats()
            except Exception:  # a counter bug must not stop the ticker for the whole class
                log.exception("class: computing class_stats failed")
                common = None
            if common is not None:
                for seat in seats:
                    seat.offer({**common, "feed_dropped": seat.feed_dropped})
            time.sleep(TICK_S)


@dataclass
class Laptop:
    """One browser in the class, whatever number of sockets it opens; the room's lock guards it."""

    number: int
    inflight: int = 0  # its requests not yet ended, over all its sockets
    sent_at: deque = field(default_factory=deque)  # when its recent requests were submitted


class Seat:
    """One WebSocket in the class, as app/ws/session.py sees it (its NoSeat plays the same role outside one)."""

    in_room = True

    def __init__(self, room: Room, laptop: Laptop, teacher: bool):
        self.room = room
        self.laptop = laptop
        self.label = f"laptop {laptop.number}" if room.class_mode else ""  # "" keeps the session's "socket N"
        self.teacher = teacher
        self.cap_noun = "laptop (the teacher's per-laptop cap)" if room.class_mode else "socket"
        self.following = False
        self.feed = None  # the socket's engine feed subscription, while it follows the feed
        self._send: Callable[[dict], bool] | None = None

    def attach(self, send: Callable[[dict], bool]) -> None:
        self._send = send

    def send(self, message: dict) -> bool:
        return self._send(message) if self._send is not None else False

    def submit_options(self) -> dict[str, Any]:
        """Checked as a request is submitted, for the whole laptop: the teacher's in-flight cap
        (UserError `too_many_requests`) and rate limit (`rate_limited`); then whether the feed may
        carry its prompt (only when "show prompts" is on right now). A request that passes counts as
        in flight until `request_ended`."""
        settings = self.room.settings
        now = self.room.clock()
        with self.room.lock:
            laptop = self.laptop
            while laptop.sent_at and laptop.sent_at[0] <= now - 60:
                laptop.sent_at.popleft()
            self._check_cap(settings.per_laptop_cap)  # outside class mode a laptop is one socket
            self._check_rate(settings.rate_per_min, now)
            laptop.sent_at.append(now)
            laptop.inflight += 1
        return {"feed_text": True} if settings.show_prompts else {}

    def _check_cap(self, cap: int) -> None:
        if self.laptop.inflight >= cap:
            raise UserError(
                f"at most {cap} requests may be in flight on one {self.cap_noun}; wait for one to end or cancel one",
                code="too_many_requests",
            )

    def _check_rate(self, rate_per_min: int | None, now: float) -> None:
        sent_at = self.laptop.sent_at
        if rate_per_min is not None and len(sent_at) >= rate_per_min:
            wait = 60 - (now - sent_at[0])
            raise UserError(
                f"at most {rate_per_min} requests a minute may come from one laptop (the teacher's "
                f"rate limit); try again in {max(1, round(wait))} s",
                code="rate_limited",
            )

    def request_ended(self, refused: bool = False) -> None:
        """One of this laptop's requests ended, or (`refused`) the engine refused it after
        `submit_options`: then it does not count against the rate limit either."""
        with self.room.lock:
            self.laptop.inflight = max(0, self.laptop.inflight - 1)
            if refused and self.laptop.sent_at:
                self.laptop.sent_at.pop()

    def follow(self, on: bool) -> None:
        self.following = on
        stage = self.room.settings.follow_stage
        if on and stage is not None:
            self.send({"type": "class_stage", "stage": stage})

    def subscribed(self, feed) -> dict:
        """The socket follows the engine feed: class_state now (returned), then the engine's last steps
        (the batch grid of a projector opened late starts full), class_stats every second."""
        self.feed = feed
        feed.catch_up()
        self.room.start_ticker()
        return self.room.state_event()

    def unsubscribed(self) -> None:
        self.feed = None

    def offer(self, event: dict) -> None:
        feed = self.feed
        if feed is not None:
            feed.interleave(event)

    @property
    def feed_dropped(self) -> int:
        feed = self.feed
        return feed.dropped if feed is not None else 0

    def leave(self) -> None:
        self.feed = None
        self.room.leave(self)
