"""Simulated students for a running `kvscope serve --class` (`kvscope class-sim`): each student is one
WebSocket that joins at a random time and sends requests one after another (a seeded mix of short and
long prompts and answers, some cancelled part-way), while one more socket subscribes to the feed as the
projector does. `run_class_sim(...) -> Summary` counts every request's terminal events (exactly one is
right; any other count is a violation), cancels, TTFT/TPOT p50/p95, tokens/s and the feed's drops."""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

from model_runner.protocol.metrics import p50_p95

from .class_scenario import MIX, QUESTIONS
from .clients import RequestRecord, now, span_s
from .measure import prompt_text

TERMINAL = frozenset({"finished", "cancelled", "error"})
WORDS_PER_TOKEN = 0.7  # about how many English words a token of this text holds (SmolLM2's tokenizer)
TEMPLATE_TOKENS = 30  # the chat template's own tokens, around the user's words
SHORT_TEST_MIX = (("tiny prompt, tiny answer", 8, 3), ("tiny prompt, short answer", 8, 6))
GRACE_S = 0.3  # how long a student keeps reading after its last request, to catch a second terminal


@dataclass
class Summary:
    """What the class saw. `ok` is False if any request ended with other than one terminal event."""

    students: int
    seconds: float
    requests: int = 0
    finished: int = 0  # ended with `finished`, the server's timeouts included (counted apart too)
    timeouts: int = 0  # `finished` with reason `timeout`: the answer was cut at the server's time limit
    cancelled: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # error code -> count (refusals included)
    cancels_sent: int = 0
    terminal_violations: int = 0  # requests with no terminal event or with more than one
    connect_failures: int = 0
    tokens: int = 0
    tokens_per_s: float | None = None
    ttft_ms: dict[str, float | None] = field(default_factory=dict)  # as the students saw it (send → first token)
    tpot_ms: dict[str, float | None] = field(default_factory=dict)
    server_ttft_ms: dict[str, float | None] = field(default_factory=dict)  # the engine's own metrics
    server_tpot_ms: dict[str, float | None] = field(default_factory=dict)
    feed_events: int = 0
    feed_dropped: int = 0
    class_stats_seen: int = 0

    @property
    def ok(self) -> bool:
        return self.terminal_violations == 0 and self.connect_failures == 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def format(self) -> str:
        def p(d: dict) -> str:
            return "/".join("-" if d.get(k) is None else f"{d[k]:.0f}" for k in ("p50", "p95")) + " ms"

        errors = ", ".join(f"{k} {v}" for k, v in sorted(self.errors.items())) or "none"
        return "\n".join(
            [
                f"class-sim: {self.students} students for {self.seconds:.0f} s",
                f"  requests {self.requests}: finished {self.finished} ({self.timeouts} cut at the server's time "
                f"limit), cancelled {self.cancelled} "
                f"(cancels sent {self.cancels_sent}), errors {sum(self.errors.values())} ({errors})",
                f"  one terminal event each: {'yes' if self.terminal_violations == 0 else 'NO'} "
                f"({self.terminal_violations} violations, {self.connect_failures} sockets failed to connect)",
                f"  TTFT p50/p95 {p(self.ttft_ms)} (students' clocks), {p(self.server_ttft_ms)} (engine)",
                f"  TPOT p50/p95 {p(self.tpot_ms)} (students' clocks), {p(self.server_tpot_ms)} (engine)",
                f"  tokens {self.tokens}, {self.tokens_per_s or 0:.1f} tokens/s over the run",
                f"  projector feed: {self.feed_events} events, {self.feed_dropped} dropped, "
                f"{self.class_stats_seen} class_stats",
            ]
        )


@dataclass
class _Request:
    record: RequestRecord
    kind: str
    cancel_after: int | None
    terminals: int = 0
    cancel_sent: bool = False


def endpoints(url: str) -> tuple[str, str]:
    """'http://host:8000' → ('ws://host:8000/ws', 'http://host:8000'): the socket and the Origin a page sends."""
    parts = urlsplit(url if "//" in url else f"http://{url}")
    secure = parts.scheme in ("https", "wss")
    return f"{'wss' if secure else 'ws'}://{parts.netloc}/ws", f"{'https' if secure else 'http'}://{parts.netloc}"


def payload(rng: random.Random, student: int, n: int, short: bool) -> tuple[str, dict]:
    """One request of the mix: (kind, generate fields). Long prompts share one document (the same
    words) with a different question after it, as a class reading the same handout would."""
    kind, tokens, output = rng.choice(SHORT_TEST_MIX if short else MIX)
    words = max(1, round((tokens - TEMPLATE_TOKENS) * WORDS_PER_TOKEN)) if not short else 3
    long = tokens > MIX[0][1]
    text = (
        prompt_text(words, variant=0, suffix=QUESTIONS[(student + n) % len(QUESTIONS)])
        if long
        else prompt_text(words, variant=student * 7 + n + 1)
    )
    return kind, {"messages": [{"role": "user", "content": text}], "max_new_tokens": output}


class _Student:
    def __init__(self, index: int, ws_url: str, origin: str, seed: int, plan: dict):
        self.index = index
        self.ws_url, self.origin = ws_url, origin
        self.rng = random.Random(f"{seed}-{index}")
        self.plan = plan
        self.requests: dict[str, _Request] = {}
        self.stray_errors = 0
        self.connected = False

    def run(self) -> None:
        from websockets.sync.client import connect

        plan = self.plan
        time.sleep(self.rng.uniform(0, plan["join_s"]))
        try:
            ws = connect(self.ws_url, origin=self.origin, open_timeout=30, max_size=None, compression=None)
        except Exception:
            return  # counted: a student who never connected
        self.connected = True
        with ws:
            n = 0
            while now() < plan["stop_at"]:
                self._one(ws, n)
                n += 1
                pause = min(self.rng.expovariate(1 / plan["think_s"]), max(0.0, plan["stop_at"] - now()))
                self._read(ws, None, now() + pause)
            self._read(ws, None, now() + GRACE_S)

    def _one(self, ws, n: int) -> None:
        rid = f"s{self.index}-{n}"
        kind, fields = payload(self.rng, self.index, n, self.plan["short"])
        cancel_after = self.rng.randint(1, 3) if self.rng.random() < self.plan["cancel_rate"] else None
        request = self.requests[rid] = _Request(RequestRecord(rid), kind, cancel_after)
        request.record.sent = request.record.server_zero = now()
        ws.send(json.dumps({"type": "generate", "request_id": rid, **fields}))
        self._read(ws, rid, self.plan["give_up_at"])
        if request.terminals == 0:
            request.record.fail("no_terminal", "no terminal event before the simulation gave up")

    def _read(self, ws, rid: str | None, until: float) -> None:
        """Read frames until `rid` has ended (or only until `until` when rid is None)."""
        while (left := until - now()) > 0:
            try:
                raw = ws.recv(timeout=left)
            except TimeoutError:
                return
            except Exception as exc:  # the server went away: what is in flight stays without an end
                for request in self.requests.values():
                    if request.terminals == 0:
                        request.record.fail("connection_lost", f"{type(exc).__name__}: {exc}")
                return
            if self._take(ws, json.loads(raw), now()) == rid and rid is not None:
                return

    def _take(self, ws, data: dict, at: float) -> str | None:
        """File one frame under its request; returns the request id when this frame ended it."""
        rid = data.get("request_id")
        request = self.requests.get(rid) if rid is not None else None
        if request is None:
            self.stray_errors += data.get("type") == "error"
            return None
        if data.get("type") in TERMINAL:
            request.terminals += 1
            if request.terminals > 1:
                return None
        ended = request.record.observe(SimpleNamespace(**{"metrics": None, **data}), at)
        if not ended and request.cancel_after is not None and len(request.record.token_ids) >= request.cancel_after:
            ws.send(json.dumps({"type": "cancel", "request_id": rid}))
            request.cancel_after, request.cancel_sent = None, True
        return rid if ended else None


class _Projector:
    """Subscribes to the engine feed as the class page does and counts what it gets and loses."""

    def __init__(self, ws_url: str, origin: str):
        self.ws_url, self.origin = ws_url, origin
        self.events = self.dropped = self.class_stats = 0
        self.reported_dropped = 0  # the last class_stats' own count of this subscriber's losses
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="class-sim-projector", daemon=True)
        self.ready = threading.Event()

    def _run(self) -> None:
        from websockets.sync.client import connect

        try:
            with connect(self.ws_url, origin=self.origin, open_timeout=30, max_size=None, compression=None) as ws:
                ws.send(json.dumps({"type": "subscribe"}))
                self.ready.set()
                while not self._stop.is_set():
                    try:
                        data = json.loads(ws.recv(timeout=0.2))
                    except TimeoutError:
                        continue
                    self.events += 1
                    self.dropped += int(data.get("dropped") or 0)
                    if data.get("type") == "class_stats":
                        self.class_stats += 1
                        self.reported_dropped = int(data.get("feed_dropped") or 0)
        except Exception:
            pass  # the summary shows a projector that saw nothing
        finally:
            self.ready.set()

    def start(self) -> None:
        self.thread.start()
        self.ready.wait(30)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)


def run_class_sim(
    url: str,
    students: int = 30,
    minutes: float = 2.0,
    seed: int = 0,
    *,
    short: bool = False,
    think_s: float = 4.0,
    join_s: float | None = None,
    cancel_rate: float = 0.15,
    drain_s: float = 300.0,
    projector: bool = True,
) -> Summary:
    """Run `students` simulated students against the server at `url` for `minutes`, then wait (at
    most `drain_s`) for what is in flight to end. `short`: tiny prompts and answers (for tests on
    the fake model). Students join over the first `join_s` seconds (default: a fifth of the run),
    think about `think_s` seconds (exponential) between requests, and cancel a `cancel_rate` share."""
    ws_url, origin = endpoints(url)
    seconds = minutes * 60
    start = now()
    plan = {
        "short": short,
        "think_s": think_s,
        "join_s": seconds / 5 if join_s is None else join_s,
        "cancel_rate": cancel_rate,
        "stop_at": start + seconds,
        "give_up_at": start + seconds + drain_s,
    }
    watcher = _Projector(ws_url, origin) if projector else None
    if watcher is not None:
        watcher.start()
    class_ = [_Student(i + 1, ws_url, origin, seed, plan) for i in range(students)]
    threads = [threading.Thread(target=s.run, name=f"class-sim-{s.index}", daemon=True) for s in class_]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + drain_s + 60)
    if watcher is not None:
        time.sleep(1.2)  # one more class_stats, so its count of drops covers the whole run
        watcher.stop()
    return summarize(class_, watcher, seconds)


def summarize(class_: list[_Student], watcher: _Projector | None, seconds: float) -> Summary:
    requests = [r for s in class_ for r in s.requests.values()]
    records = [r.record for r in requests]
    summary = Summary(students=len(class_), seconds=seconds, requests=len(requests))
    summary.connect_failures = sum(not s.connected for s in class_)
    summary.terminal_violations = sum(r.terminals != 1 for r in requests)
    summary.cancels_sent = sum(r.cancel_sent for r in requests)
    for record in records:
        if record.outcome in ("completed", "timeout"):
            summary.finished += 1
            summary.timeouts += record.outcome == "timeout"
        elif record.outcome == "cancelled":
            summary.cancelled += 1
        else:
            summary.errors[record.reason or "error"] = summary.errors.get(record.reason or "error", 0) + 1
    summary.tokens = sum(len(r.token_ids) for r in records)
    wall = span_s(records)
    summary.tokens_per_s = round(summary.tokens / wall, 3) if wall > 0 else None
    summary.ttft_ms = p50_p95([r.ttft_ms for r in records])
    summary.tpot_ms = p50_p95([r.tpot_ms for r in records])
    metrics = [r.server_metrics or {} for r in records]
    summary.server_ttft_ms = p50_p95([m.get("ttft_ms") for m in metrics])
    summary.server_tpot_ms = p50_p95([m.get("tpot_ms") for m in metrics])
    if watcher is not None:
        summary.feed_events, summary.class_stats_seen = watcher.events, watcher.class_stats
        summary.feed_dropped = max(watcher.dropped, watcher.reported_dropped)
    return summary


# ---- `kvscope class-sim` ---------------------------------------------------------------------------

LIMITS = {"students": (1, 200), "minutes": (0.05, 60.0)}


def add_parser(sub) -> None:
    c = sub.add_parser("class-sim", help="simulated students against a running `kvscope serve --class`")
    c.add_argument("--url", required=True, help="the server, e.g. http://192.168.1.20:8000 (the join URL)")
    c.add_argument("--students", type=int, default=30, help="simulated laptops, one WebSocket each (default 30)")
    c.add_argument("--minutes", type=float, default=2.0, help="how long students keep sending (default 2)")
    c.add_argument("--seed", type=int, default=0, help="the mix, arrivals and cancels are fixed by it")
    c.add_argument("--short", action="store_true", help="tiny prompts and answers (a smoke test)")
    c.add_argument("--json", metavar="PATH", help="also write the summary as JSON here")
    c.set_defaults(func=main)


def main(args) -> int:
    from model_runner.protocol.errors import UserError

    for name, (lo, hi) in LIMITS.items():
        value = getattr(args, name)
        if not lo <= value <= hi:
            raise UserError(f"--{name} must be between {lo:g} and {hi:g}, got {value:g}", field=name)
    summary = run_class_sim(args.url, args.students, args.minutes, args.seed, short=args.short)
    print(summary.format(), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(summary.to_dict(), out, indent=2)
    return 0 if summary.ok else 1
