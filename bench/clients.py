"""The recording floor: clients that drive the engine the way users do and time what they receive, in-process
(one thread per client reading its RequestHandle), stepped on the caller's thread (an engine whose worker never
started) or over the real WebSocket protocol (one socket per client). Every request becomes a RequestRecord;
one that fails, times out or is cancelled is recorded with its outcome, never dropped."""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Protocol
from urllib.parse import urlsplit

from model_runner.protocol.errors import UserError
from model_runner.protocol.request import parse_generate

now = time.monotonic  # one clock for everything: the engine stamps its events with it too
STALL_S = 900.0  # a client gives up when no event at all arrives for this long (the bench never hangs)


@dataclass(frozen=True)
class Job:
    """One client's request: a `generate` payload, optionally a cancel after some tokens, and when
    it arrives: `delay_s` after the clients are released together (0 = at once)."""

    payload: dict
    cancel_after_tokens: int | None = None
    delay_s: float = 0.0


def top_two_gap(candidates: list) -> float | None:
    """How far a greedy token was from a tie, in logits: log p1 − log p2 of its two best candidates (greedy
    probabilities are a softmax at temperature 1). None when fewer than two came or the second is 0."""
    probs = [c["prob"] if isinstance(c, dict) else c.prob for c in candidates[:2]]
    return math.log(probs[0] / probs[1]) if len(probs) == 2 and probs[1] > 0 else None


@dataclass
class RequestRecord:
    request_id: str
    outcome: str = "error"  # completed | timeout | cancelled | error
    reason: str | None = None  # finish reason, cancel cause or error code
    message: str | None = None
    prompt_tokens: int | None = None
    sent: float | None = None  # client clock when the request left
    server_zero: float | None = None  # client-clock time of the server's t_ms = 0 (over a socket: the send time)
    zero_exact: bool = False  # in-process the engine's own submit stamp is known, so delivery is exact
    accepted_lag_ms: float | None = None  # receipt of `accepted` minus its t_ms (the first event's trip)
    token_at: list[float] = field(default_factory=list)
    token_t_ms: list[float] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    top_two_gaps: list[float | None] = field(default_factory=list)  # logits, per token (top_two_gap)
    end_at: float | None = None
    server_metrics: dict | None = None
    prefix_hit_tokens: int = 0  # prompt tokens the engine took from its prefix cache (prefill_start)
    preemptions: int = 0  # times the engine preempted it (preempted events)

    # ---- what the client saw (None when it never saw it) -------------------------------------

    def _since_sent(self, t: float | None) -> float | None:
        return None if t is None or self.sent is None else (t - self.sent) * 1000

    @property
    def ttft_ms(self) -> float | None:
        return self._since_sent(self.token_at[0]) if self.token_at else None

    @property
    def e2e_ms(self) -> float | None:
        return self._since_sent(self.end_at)

    @property
    def itl_ms(self) -> list[float]:
        return [(b - a) * 1000 for a, b in zip(self.token_at, self.token_at[1:])]

    @property
    def tpot_ms(self) -> float | None:
        n = len(self.token_at)
        return (self.e2e_ms - self.ttft_ms) / (n - 1) if n > 1 and self.end_at else None

    @property
    def queue_ms(self) -> float | None:
        return (self.server_metrics or {}).get("queue_ms")

    @property
    def prefill_ms(self) -> float | None:
        return (self.server_metrics or {}).get("prefill_ms")

    @property
    def engine_itl_ms(self) -> list[float]:
        """Gaps between token stamps taken by the engine's worker: its whole per-token loop."""
        return list((self.server_metrics or {}).get("itl_ms") or [])

    @property
    def delivery_ms(self) -> list[float]:
        """Engine stamp -> client receipt per token: exact in-process; over a socket an upper bound,
        since the server's submit happened some time after the client's send."""
        if self.server_zero is None:
            return []
        return [(at - self.server_zero) * 1000 - t for at, t in zip(self.token_at, self.token_t_ms)]

    @property
    def delivery_lower_ms(self) -> list[float]:
        """Over a socket, a lower bound: the upper bound less the `accepted` event's own lag, which
        is the request's whole trip in plus that event's trip out (>= 0), so what is left never
        exceeds the true delivery; clipped at zero. Loose when `accepted` is slow to go out (the
        server starts a pump thread to send it)."""
        if self.zero_exact or self.accepted_lag_ms is None:
            return self.delivery_ms
        return [max(0.0, d - self.accepted_lag_ms) for d in self.delivery_ms]

    def observe(self, event: Any, at: float) -> bool:
        """Take one event (an engine Event, or a namespace over a JSON event); True when terminal."""
        kind = event.type
        if kind == "accepted":
            self.prompt_tokens = event.prompt_tokens
            if self.server_zero is not None:
                self.accepted_lag_ms = (at - self.server_zero) * 1000 - event.t_ms
        elif kind == "prefill_start":
            self.prefix_hit_tokens += getattr(event, "cached_tokens", 0) or 0
        elif kind == "preempted":
            self.preemptions += 1
        elif kind == "token":
            self.token_at.append(at)
            self.token_t_ms.append(event.t_ms)
            self.token_ids.append(event.id)
            self.step_ms.append(event.step_ms)
            self.top_two_gaps.append(top_two_gap(getattr(event, "candidates", None) or []))
        elif kind in ("finished", "cancelled", "error"):
            self.end_at = at
            if kind == "finished":
                self.outcome = "timeout" if event.reason == "timeout" else "completed"
                self.reason, self.server_metrics = event.reason, event.metrics
            elif kind == "cancelled":
                self.outcome, self.reason, self.server_metrics = "cancelled", event.cause, event.metrics
            else:
                self.outcome, self.reason, self.message = "error", event.code, event.message
            return True
        return False

    def fail(self, code: str, message: str) -> None:
        self.outcome, self.reason, self.message = "error", code, message
        self.end_at = self.end_at or now()

    def to_dict(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 3)

        return {
            "request_id": self.request_id,
            "outcome": self.outcome,
            "reason": self.reason,
            "message": self.message,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": len(self.token_ids),
            "queue_ms": r(self.queue_ms),
            "prefill_ms": r(self.prefill_ms),
            "ttft_ms": r(self.ttft_ms),
            "tpot_ms": r(self.tpot_ms),
            "e2e_ms": r(self.e2e_ms),
            "itl_ms": [r(x) for x in self.itl_ms],
        }


class Client(Protocol):
    def run(self, job: Job, request_id: str, go: threading.Barrier) -> RequestRecord: ...


class InProcessClient:
    """Reads the engine's RequestHandle directly, as the WebSocket session's pump thread does."""

    def __init__(self, engine):
        self.engine = engine

    def run(self, job: Job, request_id: str, go: threading.Barrier) -> RequestRecord:
        record = RequestRecord(request_id)
        handle = submit_job(self.engine, job, record, go.wait)
        if handle is not None:
            read_events(handle, job, record)
        return record


def run_stepped(engine, job: Job, request_id: str) -> RequestRecord:
    """One request on an engine whose worker thread was never started (run_stepped_all)."""
    (record,), _ = run_stepped_all(engine, [job], [request_id])
    return record


def run_stepped_all(engine, jobs: list[Job], request_ids: list[str]) -> tuple[list[RequestRecord], float]:
    """The requests submitted at once on an engine whose worker thread was never started: this thread runs
    the engine's own step() until every one has ended, while a reader per request takes its events. The
    bench puts the engine's model work on the same thread as the baselines' (or as every other route's)
    this way, so no side is helped or hurt by which thread torch runs on; (records, span_s)."""
    import torch

    records = [RequestRecord(rid) for rid in request_ids]
    handles = [submit_job(engine, job, record, lambda: None) for job, record in zip(jobs, records)]
    readers = [
        threading.Thread(target=read_events, args=(handle, job, record), name="bench-reader", daemon=True)
        for handle, job, record in zip(handles, jobs, records)
        if handle is not None
    ]
    for reader in readers:
        reader.start()
    with torch.inference_mode():  # as the engine's worker runs its steps
        while not all(handle is None or handle.done for handle in handles):
            engine.step()
    for reader in readers:
        reader.join()
    return records, span_s(records)


def span_s(records: list[RequestRecord]) -> float:
    """Seconds from the first request sent to the last terminal event (0 when none was sent or ended)."""
    starts = [r.sent for r in records if r.sent is not None]
    ends = [r.end_at for r in records if r.end_at is not None]
    return max(ends) - min(starts) if starts and ends else 0.0


def submit_job(engine, job: Job, record: RequestRecord, ready: Callable[[], Any]):
    """Validate and submit; a refusal (bad payload, queue full, prompt too long) is recorded as
    the request's error outcome, and None returned."""
    try:
        params = parse_generate(job.payload)
    except UserError as exc:
        ready()
        record.fail(exc.code, exc.message)
        return None
    ready()
    record.sent = now()
    try:
        handle = engine.submit(params, record.request_id)
    except UserError as exc:
        record.fail(exc.code, exc.message)
        return None
    record.server_zero, record.zero_exact = handle.submitted_at, True
    return handle


def read_events(handle, job: Job, record: RequestRecord) -> None:
    """Take the handle's events until the terminal one, cancelling when the job says so."""
    cancelled = False
    while True:
        event = handle.next_event(timeout=STALL_S)
        if event is None:
            handle.cancel()
            record.fail("stalled", f"no event for {STALL_S:.0f} s")
            return
        if record.observe(event, now()):
            return
        if not cancelled and _due(job, record):
            handle.cancel()
            cancelled = True


class WebSocketClient:
    """One socket per client on a running `kvscope serve`, sending the Origin a browser would."""

    def __init__(self, url: str):
        self.url = url
        parts = urlsplit(url)
        self.origin = f"{'https' if parts.scheme == 'wss' else 'http'}://{parts.netloc}"

    def run(self, job: Job, request_id: str, go: threading.Barrier) -> RequestRecord:
        from websockets.sync.client import connect

        record = RequestRecord(request_id)
        try:
            ws = connect(self.url, origin=self.origin, open_timeout=30, max_size=None, compression=None)
        except Exception as exc:  # counted as a failed request, with the reason
            go.wait()
            record.fail("connect_failed", f"{type(exc).__name__}: {exc}")
            return record
        with ws:
            go.wait()
            record.sent = record.server_zero = now()
            ws.send(json.dumps({"type": "generate", "request_id": request_id, **job.payload}))
            cancelled = False
            while True:
                try:
                    raw = ws.recv(timeout=STALL_S)
                except TimeoutError:
                    record.fail("stalled", f"no event for {STALL_S:.0f} s")
                    return record
                except Exception as exc:
                    record.fail("connection_lost", f"{type(exc).__name__}: {exc}")
                    return record
                at = now()
                data = json.loads(raw)
                if data.get("request_id") not in (request_id, None):
                    continue
                if record.observe(SimpleNamespace(**{"metrics": None, **data}), at):
                    return record
                if not cancelled and _due(job, record):
                    ws.send(json.dumps({"type": "cancel", "request_id": request_id}))
                    cancelled = True


def _due(job: Job, record: RequestRecord) -> bool:
    return job.cancel_after_tokens is not None and len(record.token_ids) >= job.cancel_after_tokens


class _Arrival:
    """The clients' common start, then this client's own delay before it sends."""

    def __init__(self, go: threading.Barrier, delay_s: float):
        self.go, self.delay_s = go, delay_s

    def wait(self) -> None:
        self.go.wait()
        time.sleep(self.delay_s)


def run_jobs(client: Client, jobs: list[Job], prefix: str) -> tuple[list[RequestRecord], float]:
    """Run the jobs as concurrent clients, released together (each then waits its job's delay_s);
    (records in job order, wall seconds from the first send to the last terminal event)."""
    records: list[RequestRecord | None] = [None] * len(jobs)
    go = threading.Barrier(len(jobs), timeout=120)  # a client that dies before sending breaks it, not hangs it

    def one(i: int) -> None:
        rid = f"{prefix}-{i}"
        try:
            records[i] = client.run(jobs[i], rid, _Arrival(go, jobs[i].delay_s) if jobs[i].delay_s > 0 else go)
        except Exception as exc:  # a client bug still yields a counted failure, not a lost request
            record = RequestRecord(rid)
            record.fail("client_error", f"{type(exc).__name__}: {exc}")
            records[i] = record

    threads = [threading.Thread(target=one, args=(i,), name=f"bench-client-{i}", daemon=True) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done = [r for r in records if r is not None]
    return done, span_s(done)
