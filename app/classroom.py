"""Classroom mode: the projected /class page and its QR code, /api/class (teacher controls behind a
key compared in constant time, never logged) and each WebSocket's `Seat` (its "laptop N" label,
per-laptop cap, rate limit, notices, follow-me and the class counters pushed to feed subscribers)."""

from __future__ import annotations

import hmac
import io
import itertools
import logging
import re
import secrets
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

from flask import Blueprint, Flask, Response, current_app, jsonify, redirect, render_template, request

from bench.stats import percentile
from model_runner.errors import UserError
from model_runner.request import json_repr

from .api import nested_error
from .engine_ext import get_engine
from .protocol import parse_json_object
from .security import is_loopback, origin_refusal

log = logging.getLogger(__name__)
bp = Blueprint("classroom", __name__)

KEY = "kvscope_class"
COOKIE = "kvscope_teacher"
LAPTOP_COOKIE = "kvscope_laptop"  # a random id per browser: one "laptop N" for all its sockets
LAPTOP_COOKIE_S = 12 * 3600  # a school day; a new day starts numbering afresh
HEADER = "X-Teacher-Key"
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
        if name in ("paused", "show_prompts"):
            if not isinstance(value, bool):
                raise UserError(f"`{name}` must be true or false, got {json_repr(value)}", field=name)
        elif name in LIMITS:
            lo, hi = LIMITS[name]
            nullable = name == "rate_per_min"
            ok = isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi
            if not ok and not (nullable and value is None):
                none = " or null (no limit)" if nullable else ""
                raise UserError(
                    f"`{name}` must be an integer from {lo} to {hi}{none}, got {json_repr(value)}", field=name
                )
        else:
            known = ", ".join(n for n in Settings.__dataclass_fields__ if n != "follow_stage")
            raise UserError(f"`{name}` is not a class setting; known: {known}", field=name)
        setattr(out, name, value)
    return out


class Room:
    """The class: its settings, the open sockets (seats) and the counters it reports. The engine
    stays the owner of requests: pausing and cancelling go through its own methods."""

    def __init__(self, engine, *, class_mode: bool, per_laptop_cap: int, clock: Callable[[], float] = time.monotonic):
        self.engine = engine
        self.class_mode = class_mode
        self.settings = Settings(per_laptop_cap=per_laptop_cap)
        self.clock = clock
        self._lock = threading.Lock()
        self._settings_lock = threading.Lock()
        self._seats: list[Seat] = []
        self._laptops: dict[str, Laptop] = {}  # cookie id → laptop, for the server's life
        self._numbers = itertools.count(1)
        self.counts = {"finished": 0, "cancelled": 0, "errors": 0}
        self._ends: deque[tuple[float, float | None, float | None]] = deque()  # (at, ttft_ms, tpot_ms)
        self._samples: deque[tuple[float, int]] = deque()  # (at, tokens generated so far)
        self._ticker: threading.Thread | None = None
        listen = getattr(engine, "add_end_listener", None)  # a test's stub engine may have none
        if listen is not None:
            listen(self._on_end)

    # ---- seats ---------------------------------------------------------------------------------

    def seat(self, teacher: bool, laptop_id: str | None = None) -> "Seat":
        """A socket joins. Sockets from one browser (its `kvscope_laptop` cookie) share one laptop: one
        label, one rate limit and one in-flight cap, though the page opens a socket per request; a
        socket without the cookie (a script, the class simulator) is a laptop of its own."""
        with self._lock:
            laptop = self._laptops.get(laptop_id) if laptop_id else None
            if laptop is None:
                laptop = Laptop(next(self._numbers))
                if laptop_id:
                    self._laptops[laptop_id] = laptop
            seat = Seat(self, laptop, teacher)
            self._seats.append(seat)
        self.publish_state()
        return seat

    def leave(self, seat: "Seat") -> None:
        with self._lock:
            if seat in self._seats:
                self._seats.remove(seat)
        self.publish_state()

    @property
    def laptops(self) -> int:
        """Students' laptops with the page open: those with a socket that does not carry the teacher's key."""
        with self._lock:
            return len({id(s.laptop) for s in self._seats if not s.teacher})

    def current(self) -> Settings:
        paused = getattr(self.engine, "paused", self.settings.paused)  # the engine's own flag when it has one
        return Settings(**{**self.settings.to_dict(), "paused": bool(paused)})

    def state_event(self) -> dict[str, Any]:
        return {"type": "class_state", "laptops": self.laptops, "settings": self.current().to_dict()}

    def publish_state(self) -> None:
        """class_state to every feed subscriber, in its feed buffer (never blocking this thread)."""
        event = self.state_event()
        for seat in self._subscribed():
            seat.offer(event)

    def _subscribed(self) -> list["Seat"]:
        with self._lock:
            return [s for s in self._seats if s.feed is not None]

    def _broadcast(self, message: dict, seats: list["Seat"]) -> None:
        """Send a message to sockets on a thread of its own: a stuck student never holds the teacher."""
        if seats:
            threading.Thread(target=lambda: [s.send(message) for s in seats], name="kvscope-class", daemon=True).start()

    # ---- the teacher's controls ----------------------------------------------------------------------

    def update(self, changes: dict) -> Settings:
        pause = getattr(self.engine, "set_paused", None)
        if "paused" in changes and pause is None:
            raise UserError("this engine cannot hold admissions (a remote engine schedules itself)", field="paused")
        with self._settings_lock:  # two teacher tabs at once: each change applies whole
            new = parse_settings(changes, self.current())
            old, self.settings = self.settings, new
            if "paused" in changes:
                pause(new.paused)
        if old.show_prompts and not new.show_prompts:
            withdraw = getattr(self.engine, "withdraw_feed_text", None)
            if withdraw is not None:
                withdraw()
        if new.show_prompts != old.show_prompts:
            with self._lock:
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
        with self._lock:
            followers = [s for s in self._seats if s.following]
        self._broadcast({"type": "class_stage", "stage": stage}, followers)
        self.publish_state()
        return stage

    def cancel_all(self) -> int:
        cancel = getattr(self.engine, "cancel_all", None)
        if cancel is None:
            raise UserError("this engine cannot cancel every request at once", code="forbidden")
        count = cancel(CANCEL_CAUSE)
        log.info("class: the teacher cancelled %d requests", count)
        return count

    # ---- counters --------------------------------------------------------------------------------

    def _on_end(self, seq, terminal: dict) -> None:
        """The engine's end listener (engine lock held): count the end, keep its TTFT and TPOT."""
        kind = terminal.get("type")
        metrics = terminal.get("metrics") or {}
        counter = "errors" if kind == "error" else kind
        with self._lock:
            self.counts[counter] = self.counts.get(counter, 0) + 1
            self._ends.append((self.clock(), metrics.get("ttft_ms"), metrics.get("tpot_ms")))

    def stats(self) -> dict[str, Any]:
        """The class counters now: the engine's queue, ends so far, TTFT/TPOT percentiles over the
        last minute (the engine's per-request metrics, as the lab shows them) and tokens/s."""
        now = self.clock()
        snapshot = self.engine.snapshot()
        with self._lock:
            while self._ends and self._ends[0][0] < now - STATS_WINDOW_S:
                self._ends.popleft()
            ttft = [t for _, t, _ in self._ends if t is not None]
            tpot = [t for _, _, t in self._ends if t is not None]
            counts = dict(self.counts)
        return {
            "type": "class_stats",
            "waiting": snapshot.get("waiting"),  # None: a remote engine without /metrics cannot say
            "running": snapshot.get("running"),
            **counts,
            "tokens_per_s": self._tokens_per_s(now),
            "ttft_ms": _p50_p95(ttft),
            "tpot_ms": _p50_p95(tpot),
            "window_s": STATS_WINDOW_S,
        }

    def _tokens_per_s(self, now: float) -> float | None:
        """Tokens the engine chose in the last RATE_WINDOW_S seconds (less until that much history
        exists), per second; None for an engine that does not count them."""
        total = getattr(self.engine, "tokens_generated", None)
        if total is None:
            return None
        with self._lock:
            self._samples.append((now, total))
            while len(self._samples) > 1 and self._samples[1][0] <= now - RATE_WINDOW_S:
                self._samples.popleft()
            (t0, n0), (t1, n1) = self._samples[0], self._samples[-1]
        return round((n1 - n0) / (t1 - t0), 3) if t1 > t0 else 0.0

    # ---- the once-a-second ticker -------------------------------------------------------------------

    def start_ticker(self) -> None:
        with self._lock:
            if self._ticker is not None and self._ticker.is_alive():
                return
            self._ticker = threading.Thread(target=self._tick, name="kvscope-class-stats", daemon=True)
            self._ticker.start()

    def _tick(self) -> None:
        """class_stats to every subscriber once a second, while any is subscribed."""
        while True:
            with self._lock:  # under the lock: a seat subscribing now either is seen or starts a new ticker
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


def _p50_p95(values: list[float]) -> dict[str, float | None]:
    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    return {"p50": r(percentile(values, 50)), "p95": r(percentile(values, 95))}


@dataclass
class Laptop:
    """One browser in the class, whatever number of sockets it opens; the room's lock guards it."""

    number: int
    inflight: int = 0  # its requests not yet ended, over all its sockets
    sent_at: deque = field(default_factory=deque)  # when its recent requests were submitted


class Seat:
    """One WebSocket in the class, as app/session.py sees it (duck-typed there)."""

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
        with self.room._lock:
            laptop = self.laptop
            while laptop.sent_at and laptop.sent_at[0] <= now - 60:
                laptop.sent_at.popleft()
            cap = settings.per_laptop_cap  # outside class mode a laptop is one socket: the per-socket cap
            if laptop.inflight >= cap:
                raise UserError(
                    f"at most {cap} requests may be in flight on one {self.cap_noun}; wait for one to end or cancel one",
                    code="too_many_requests",
                )
            if settings.rate_per_min is not None and len(laptop.sent_at) >= settings.rate_per_min:
                wait = 60 - (now - laptop.sent_at[0])
                raise UserError(
                    f"at most {settings.rate_per_min} requests a minute may come from one laptop (the teacher's "
                    f"rate limit); try again in {max(1, round(wait))} s",
                    code="rate_limited",
                )
            laptop.sent_at.append(now)
            laptop.inflight += 1
        return {"feed_text": True} if settings.show_prompts else {}

    def request_ended(self, refused: bool = False) -> None:
        """One of this laptop's requests ended, or (`refused`) the engine refused it after
        `submit_options`: then it does not count against the rate limit either."""
        with self.room._lock:
            self.laptop.inflight = max(0, self.laptop.inflight - 1)
            if refused and self.laptop.sent_at:
                self.laptop.sent_at.pop()

    def follow(self, on: bool) -> None:
        self.following = on
        stage = self.room.settings.follow_stage
        if on and stage is not None:
            self.send({"type": "class_stage", "stage": stage})

    def subscribed(self, feed) -> dict:
        """The socket follows the engine feed: class_state now (returned), class_stats every second."""
        self.feed = feed
        self.room.start_ticker()
        return self.room.state_event()

    def unsubscribed(self) -> None:
        self.feed = None

    def offer(self, event: dict) -> None:
        feed = self.feed
        if feed is not None:
            # Into the feed's own bounded buffer, so class events keep the feed's order, never block
            # the sender, and a reader that falls behind loses them like any feed event.
            feed._offer(event)

    @property
    def feed_dropped(self) -> int:
        feed = self.feed
        return feed.dropped if feed is not None else 0

    def leave(self) -> None:
        self.feed = None
        self.room.leave(self)


# ---- Flask ---------------------------------------------------------------------------------------


def init_app(app: Flask) -> None:
    app.extensions[KEY] = Room(
        app.extensions["kvscope_engine"],
        class_mode=bool(app.config.get("CLASS_MODE")),
        per_laptop_cap=int(app.config["MAX_INFLIGHT_PER_SOCKET"]),
    )
    app.register_blueprint(bp)
    app.after_request(_give_laptop_id)


def _give_laptop_id(response: Response) -> Response:
    """In class mode, a page answered to a browser without one gets a random laptop id (no name,
    no address: only so its sockets count as one laptop)."""
    if (
        current_app.config.get("CLASS_MODE")
        and response.mimetype == "text/html"
        and LAPTOP_COOKIE not in request.cookies
    ):
        response.set_cookie(
            LAPTOP_COOKIE, secrets.token_urlsafe(12), max_age=LAPTOP_COOKIE_S, httponly=True, samesite="Strict"
        )
    return response


def get_room() -> Room:
    return current_app.extensions[KEY]


def seat_for_socket() -> Seat | None:
    """The seat of a WebSocket being opened (in its handshake's request context): in class mode or
    on a loopback server; None elsewhere (a plain LAN server keeps plain sockets)."""
    config = current_app.config
    if not (config.get("CLASS_MODE") or is_loopback(str(config.get("BIND_HOST", "")).strip("[]").lower())):
        return None
    laptop_id = request.cookies.get(LAPTOP_COOKIE) if config.get("CLASS_MODE") else None  # else: one per socket
    return get_room().seat(teacher=has_teacher_key(), laptop_id=laptop_id)


def _key_matches(given: str | None) -> bool:
    key = current_app.config.get("TEACHER_KEY")
    if not key or not given:
        return False
    return hmac.compare_digest(given.encode("utf-8"), str(key).encode("utf-8"))


def has_teacher_key() -> bool:
    """The teacher's cookie or X-Teacher-Key header holds the key (compared in constant time)."""
    return _key_matches(request.cookies.get(COOKIE)) or _key_matches(request.headers.get(HEADER))


def is_teacher() -> bool:
    """The key, or (outside class mode) a request from this machine: a teacher on their own laptop."""
    if has_teacher_key():
        return True
    return not current_app.config.get("CLASS_MODE") and is_loopback(request.remote_addr or "")


def join_url() -> str:
    return current_app.config.get("JOIN_URL") or request.host_url


class TeacherOnly(UserError):
    def __init__(self):
        super().__init__(
            "only the teacher may do this: open the teacher URL that `kvscope serve --class` printed",
            code="teacher_only",
        )


STATUS = {"teacher_only": 403, "forbidden": 403, "model_loading": 503, "model_failed": 503}


@bp.errorhandler(UserError)
def _user_error(exc: UserError):
    return nested_error(exc, STATUS)


@bp.get("/class")
def class_page():
    given = request.args.get("key")
    if given is not None and _key_matches(given):
        # The key leaves the address bar (and the history) at once; the cookie carries it from here.
        response = redirect("/class", code=303)
        response.set_cookie(COOKIE, given, httponly=True, samesite="Strict", path="/")
        return response
    status = 403 if given is not None else 200
    return render_template("class.html", join_url=join_url(), teacher=is_teacher(), class_mode=_class_mode()), status


def _class_mode() -> bool:
    return bool(current_app.config.get("CLASS_MODE"))


@bp.get("/class/qr.svg")
def qr_svg():
    import segno  # imported here: only the projector asks for it

    out = io.BytesIO()
    segno.make(join_url(), error="m").save(out, kind="svg", scale=10, border=2, dark="#000", light="#fff")
    response = Response(out.getvalue(), mimetype="image/svg+xml")
    response.headers["Cache-Control"] = "no-store"
    return response


@bp.get("/api/class")
def class_state():
    room = get_room()
    return jsonify(
        {
            "class_mode": _class_mode(),
            "join_url": join_url(),
            "teacher": is_teacher(),
            "laptops": room.laptops,
            "settings": room.current().to_dict(),
            "policy": get_engine().snapshot()["policy"],
        }
    )


def _teacher_body() -> dict:
    """The request's JSON object, once the caller is known to be the teacher."""
    refusal = origin_refusal(required=False)
    if refusal is not None:
        raise _Refused(refusal)
    if not is_teacher():
        raise TeacherOnly()
    text = request.get_data(as_text=True)
    return parse_json_object(text) if text.strip() else {}


class _Refused(Exception):
    def __init__(self, response: Response):
        self.response = response


@bp.errorhandler(_Refused)
def _refused(exc: _Refused):
    return exc.response


@bp.post("/api/class/settings")
def class_settings():
    body = _teacher_body()
    return jsonify({"settings": get_room().update(body).to_dict()})


@bp.post("/api/class/policy")
def class_policy():
    """The engine's run-time policies, as POST /api/engine/policy, for the teacher on any address."""
    body = _teacher_body()
    return jsonify({"policy": get_engine().set_policy(body).to_dict()})


@bp.post("/api/class/cancel-all")
def class_cancel_all():
    _teacher_body()
    return jsonify({"cancelled": get_room().cancel_all()})


@bp.post("/api/class/stage")
def class_stage():
    body = _teacher_body()
    return jsonify({"stage": get_room().set_stage(body.get("stage"))})


# ---- `kvscope serve --class` ----------------------------------------------------------------------


def lan_address() -> str:
    """This machine's address on the local network: the source address of a route to a public
    address (a UDP connect sends nothing), else the hostname's; 127.0.0.1 with no network at all."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: never reached, only routed
            return probe.getsockname()[0]
    except OSError:
        pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def class_setup(bind: str, port: int, names: list[str] | None, key: str | None = None) -> tuple[dict, list[str]]:
    """(app config, lines to print) for a class: the LAN address and hostname (and `names`) as Host
    names, a teacher key (KVSCOPE_TEACHER_KEY or a fresh random one), the join and teacher URLs."""
    import os
    import secrets
    import socket

    specific = bind not in ("0.0.0.0", "::", "") and not is_loopback(bind)
    lan = bind if specific else lan_address()  # --host given as one address: students use that one
    hostname = socket.gethostname()
    key = key or os.environ.get("KVSCOPE_TEACHER_KEY") or secrets.token_urlsafe(16)
    hosts = [lan, hostname, *(names or [])]
    if "." not in hostname:
        hosts.append(f"{hostname}.local")  # mDNS, as macOS and most Linux desktops answer
    host = f"[{lan}]" if ":" in lan else lan
    join = f"http://{host}:{port}/"
    config = {"CLASS_MODE": True, "TEACHER_KEY": key, "CLASS_HOSTS": hosts, "JOIN_URL": join}
    lines = [
        f"kvscope: class mode: students open {join}",
        f"kvscope: teacher view (project it; keep this address to yourself): {join}class?key={key}",
        f"kvscope: WARNING: anyone on this network who can reach {lan}:{port} can now use the model, without "
        "logging in; only the teacher's key changes settings",
    ]
    return config, lines
