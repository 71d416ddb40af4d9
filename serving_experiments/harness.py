"""The job harness every serving-chapter experiment runs in: validated parameters, a Job that submits
the experiment's requests (feed label "experiment") and files the engine feed's events about them, a
policy set for the job's duration and restored after, and the small helpers the experiments share."""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable

from model_runner.protocol.errors import UserError
from model_runner.protocol.fields import check_int
from model_runner.protocol.request import parse_generate
from model_runner.text.prompt import plan

LABEL = "experiment"
JOB_TIMEOUT_S = 240.0  # a job that has not ended by then is cancelled: a stuck experiment must not hold the lock


# ---- params ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    default: int
    lo: int
    hi: int


def parse_params(data: Any, spec: dict[str, Param]) -> dict[str, int]:
    """Untrusted JSON → {name: int}; UserError naming the field and its limit."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError("send the experiment's parameters as a JSON object (or nothing)", code="invalid_json")
    for name in data:
        if name not in spec:
            known = ", ".join(spec) or "none"
            raise UserError(f"unknown parameter `{str(name)[:40]}` (allowed: {known})", field=str(name)[:40])
    out = {}
    for name, p in spec.items():
        out[name] = check_int(name, data.get(name, p.default), p.lo, p.hi)
    return out


# ---- a job: the experiment's requests and the feed events about them -----------------------------------


class Job:
    """Submits an experiment's requests and files the engine feed's events about them (other users'
    requests, which may share the steps, are left out)."""

    def __init__(self, engine):
        self.engine = engine
        self.sub = engine.feed.subscribe(capacity=8192)
        self.handles: dict[str, Any] = {}
        self.names: dict[str, str] = {}  # engine key → our name
        self.steps: list[dict] = []  # our engine_step events, rows cut to our requests
        self.log: list[dict] = []  # every feed event about our requests, in order (steps included)
        self.ended: set[str] = set()
        self.settled: set[str] = set()  # ended, and the step it ended in has been read too
        self.terminals: dict[str, dict] = {}  # name → its terminal event, once its stream is drained
        self.deadline = time.monotonic() + JOB_TIMEOUT_S

    def submit(self, name: str, payload: dict) -> None:
        handle = self.engine.submit(parse_generate(payload), label=LABEL)
        self.handles[name] = handle
        self.names[handle.sequence.key] = name

    def submit_together(self, payloads: dict[str, dict]) -> None:
        """Queue requests so that the scheduler first sees them all at once (the first would otherwise
        be admitted alone while the rest are still being submitted): admissions are held meanwhile
        by the local engine's `admissions_held` (never the teacher's pause); a remote engine has none."""
        local = self.engine.local
        with local.admissions_held() if local is not None else nullcontext():
            for name, payload in payloads.items():
                self.submit(name, payload)

    def pump(self, until: Callable[[], bool]) -> None:
        """Read the feed until `until()` holds; cancel everything and fail past the deadline."""
        while not until():
            if time.monotonic() > self.deadline:
                for handle in self.handles.values():
                    handle.cancel()
                raise UserError(f"the experiment did not finish within {JOB_TIMEOUT_S:g} s", code="internal")
            event = self.sub.next_event(timeout=0.2)
            if event is not None:
                self._file(event)

    def _file(self, event: dict) -> None:
        if event["type"] == "engine_step":
            rows = [
                {**row, "request": self.names[row["request"]]} for row in event["batch"] if row["request"] in self.names
            ]
            if rows:
                # a request's end is published inside its last step, before that step's own event
                self.settled.update(r["request"] for r in rows if r["request"] in self.ended)
                step = {**event, "batch": rows}
                self.steps.append(step)
                self.log.append(step)
            return
        name = self.names.get(event.get("request"))
        if name is None:
            return
        self.log.append({**event, "request": name})
        if event["type"] == "engine_end":
            self.ended.add(name)

    def wait(self) -> dict[str, dict]:
        """Until every request has ended → {name: its terminal event}; each stream is drained here."""
        self.pump(lambda: all(h.done for h in self.handles.values()))
        for name, handle in self.handles.items():
            if name not in self.terminals:
                end = self.terminals[name] = [e.to_dict() for e in handle][-1]
                if end["type"] != "finished" or end["reason"] == "timeout":  # a timeout ends it outside any step
                    why = end.get("message") or end.get("cause") or end.get("reason") or ""
                    raise UserError(f"an experiment request ended with {end['type']}: {why}", code="internal")
        self.pump(lambda: len(self.settled) == len(self.handles))  # the feed lags the streams a little
        return dict(self.terminals)

    def close(self) -> None:
        self.sub.close()


@contextmanager
def job(engine, **policy):
    """A Job under `policy` (changes from the policy in force), restored afterwards whatever happens."""
    before = engine.policy
    if policy:
        engine.set_policy(policy)
    j = Job(engine)
    try:
        yield j
    finally:
        j.close()
        for handle in j.handles.values():
            handle.cancel()
        if policy:
            engine.set_policy(before.to_dict())


# ---- helpers ------------------------------------------------------------------------------------------


def r3(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def ask(content: str, new_tokens: int, system: str | None = None) -> dict:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    return {"messages": messages, "max_new_tokens": new_tokens}


def text_of_tokens(engine, text: str, tokens: int) -> str:
    """The longest prefix of `text` repeated that has `tokens` tokens in the model's tokenizer."""
    tok = engine.local.loaded.tokenizer
    long = text * (tokens // 8 + 2)
    ids, offsets = tok.encode(long)
    return long[: offsets[min(tokens, len(ids)) - 1][1]]


def prompt_ids(engine, payload: dict) -> list[int]:
    loaded = engine.local.loaded
    return plan(loaded.tokenizer, parse_generate(payload), loaded.facts.context_window).ids


def decode_steps(steps: list[dict], name: str) -> list[dict]:
    """The steps in which request `name` decoded a token."""
    return [s for s in steps if any(r["request"] == name and r["kind"] == "decode" for r in s["batch"])]


def decode_steps_ms(steps: list[dict], name: str) -> list[float]:
    return [s["ms"] for s in decode_steps(steps, name)]


def first_prefill_steps(steps: list[dict]) -> list[dict]:
    """The steps whose first row is a prefill (a lone request's prompt steps)."""
    return [s for s in steps if s["batch"][0]["kind"] == "prefill"]


def admit_of(j: Job, name: str) -> dict:
    """The engine_admit event of request `name` in this job."""
    return next(e for e in j.log if e["type"] == "engine_admit" and e["request"] == name)
