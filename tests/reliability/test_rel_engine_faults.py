"""Cases 16–19: faults inside the engine, with the engine in this process so a test can break it —
a model step that raises, a worker thread that dies — and the bookkeeping that must survive any
mix of endings: exactly one terminal event per request, and no KV cache or memory left behind."""

from __future__ import annotations

import gc
import random
import threading
import time
from collections import Counter

import psutil
import pytest
import torch
from kvscope_testkit import WAIT_S, Client, LogCursor, end_is, generate_frame, terminals

from model_runner.protocol.errors import UserError
from model_runner.protocol.request import parse_generate
from model_runner.shared.policy import Policy

FAIL_AT_PREFILL = "FAIL@PREFILL"  # a prompt holding this makes the model's prefill raise
FAIL_AT_DECODE = "FAIL@DECODE"  # ... or its third decode step


class InjectedFault(RuntimeError):
    pass


def inject_model_faults(engine, monkeypatch) -> None:
    """Make the model step raise for requests whose prompt holds a FAIL@ marker: in their prefill,
    or in every decode step from their third on (so running it alone fails too, and the engine's
    retry of each request alone isolates exactly that request)."""
    forward = engine._forward
    decodes: Counter = Counter()

    def faulty(work):
        for item in work:
            prompt = bytes(i for i in item.seq.prompt_ids if i < 256)
            if FAIL_AT_PREFILL.encode() in prompt and item.kind == "prefill":
                raise InjectedFault("injected fault in prefill")
            if FAIL_AT_DECODE.encode() in prompt and item.kind == "decode":
                decodes[item.seq.key] += 1
                if decodes[item.seq.key] >= 3:
                    raise InjectedFault("injected fault in decode step 3")
        return forward(work)

    faulty.take_attention = forward.take_attention  # the rest of the forward's surface, unchanged
    faulty.report = forward.report
    monkeypatch.setattr(engine, "_forward", faulty)


def ask(text: str, **fields) -> dict:
    return {"messages": [{"role": "user", "content": text}], **fields}


# ---- case 16 ------------------------------------------------------------------------------------

KINDS = ("finish", "cancel_at_once", "cancel_mid", "error_prefill", "error_decode", "invalid", "disconnect")


def one_run(client: Client, rid: str, kind: str, rng: random.Random) -> str:
    """Run one request of the given kind; return what the client saw end it ("" if it left)."""
    if kind == "invalid":
        client.generate(rid, max_new_tokens=0)
    elif kind.startswith("error"):
        marker = FAIL_AT_PREFILL if kind == "error_prefill" else FAIL_AT_DECODE
        client.generate(rid, **ask(f"Please {marker} now."), max_new_tokens=8)
    else:
        client.generate(rid, max_new_tokens=rng.randint(1, 8))
    if kind == "cancel_at_once":
        client.cancel(rid)
    elif kind in ("cancel_mid", "disconnect"):
        client.wait(rid, lambda evs: any(e["type"] in ("token", "finished", "cancelled", "error") for e in evs))
        if kind == "disconnect":
            client.drop()
            return ""
        client.cancel(rid)
    ends = terminals(client.wait(rid))
    return ends[0]["type"] + (
        f":{ends[0].get('code') or ends[0].get('cause') or ''}" if ends[0]["type"] != "finished" else ""
    )


def run_mixed(server, runs: int, threads: int = 4, seed: int = 16) -> tuple[dict, dict]:
    """`runs` requests of mixed kinds from `threads` concurrent clients; returns
    ({rid: (kind, outcome seen)}, {rid: client socket events})."""
    outcomes: dict[str, tuple[str, str]] = {}
    histories: dict[str, list[dict]] = {}
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        rng = random.Random(seed + w)
        client = Client(server)
        try:
            for i in range(w, runs, threads):
                rid, kind = f"m{i}", KINDS[rng.randrange(len(KINDS))]
                outcomes[rid] = (kind, one_run(client, rid, kind, rng))
                histories[rid] = client.events[rid]
                if kind == "disconnect":
                    client = Client(server)
            client.run(f"last-{w}", max_new_tokens=1)  # anything late for earlier ids would show up before this ends
        except BaseException as exc:  # surfaced by the main thread
            errors.append(exc)
        finally:
            client.close()

    pool = [threading.Thread(target=worker, args=(w,), name=f"mixed-{w}") for w in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(WAIT_S * 10)
    assert not errors, errors[0]
    assert not any(t.is_alive() for t in pool), "a client hung"
    return outcomes, histories


EXPECTED = {
    "finish": {"finished"},
    "cancel_at_once": {"cancelled:client", "finished"},  # a 1-token answer may end before the cancel lands
    "cancel_mid": {"cancelled:client", "finished"},
    "error_prefill": {"error:internal"},
    "error_decode": {"error:internal"},
    "invalid": {"error:invalid_request"},
    "disconnect": {""},
}


@pytest.mark.parametrize("runs", [200, pytest.param(1000, marks=pytest.mark.full)])
def test_16_every_stream_ends_with_exactly_one_terminal_event_in_mixed_runs(
    runs, engine_factory, inprocess_server, monkeypatch, figures
):
    engine = engine_factory("fake")
    inject_model_faults(engine, monkeypatch)
    server = inprocess_server(engine)
    log = LogCursor(server)
    outcomes, histories = run_mixed(server, runs)
    assert len(outcomes) == runs
    seen_by_client = {rid: len(terminals(evs)) for rid, evs in histories.items()}
    ended = log.wait_ended([rid for rid, (kind, _) in outcomes.items() if kind != "invalid"])
    logged = log.ended()
    lost = [
        rid
        for rid, (kind, _) in outcomes.items()
        if (kind != "disconnect" and seen_by_client[rid] == 0) or (kind != "invalid" and rid not in ended)
    ]
    duplicated = [rid for rid, (kind, _) in outcomes.items() if seen_by_client[rid] > 1 or len(logged.get(rid, [])) > 1]
    assert lost == [] and duplicated == []
    for rid, (kind, seen) in outcomes.items():
        assert seen in EXPECTED[kind], (rid, kind, seen)
        if kind == "disconnect":
            assert end_is(ended[rid], "cancelled", cause="disconnect") or end_is(ended[rid], "finished"), (
                rid,
                ended[rid],
            )
        if kind != "disconnect":
            assert histories[rid][-1]["type"] in ("finished", "cancelled", "error"), "nothing after the terminal event"
    ok, why = engine.health()
    assert ok, why
    kinds = Counter(kind for kind, _ in outcomes.values())
    figures[f"16-{runs}"] = {
        "runs": runs,
        "lost": len(lost),
        "duplicated": len(duplicated),
        "kinds": dict(kinds),
        "outcomes": dict(Counter(f"{k} -> {o or ended[r]['outcome']}" for r, (k, o) in outcomes.items())),
    }


# ---- case 17 ------------------------------------------------------------------------------------


def test_17_an_exception_in_a_model_step_fails_that_request_and_the_worker_serves_the_next(
    engine_factory, inprocess_server, monkeypatch, figures
):
    engine = engine_factory("fake")
    inject_model_faults(engine, monkeypatch)
    client = Client(inprocess_server(engine))
    ends = {}
    for rid, text in (("boom-prefill", f"Please {FAIL_AT_PREFILL}."), ("boom-decode", f"Please {FAIL_AT_DECODE}.")):
        events = client.run(rid, **ask(text), max_new_tokens=20)
        end = terminals(events)
        assert len(end) == 1 and end[0] is events[-1]
        assert end[0]["type"] == "error" and end[0].get("code") == "internal", end[0]
        assert "InjectedFault" in end[0]["message"]
        ends[rid] = [e["type"] for e in events]
        following = client.run(f"after-{rid}")  # same socket, same worker
        assert terminals(following)[0]["type"] == "finished" and terminals(following)[0]["reason"] == "eos"
    assert "token" not in ends["boom-prefill"] and ends["boom-decode"].count("token") == 3
    assert engine.health() == (True, "ready")
    client.close()
    figures["17"] = {
        "prefill_fault": "error internal, next request finished",
        "decode_fault": "error internal after 3 tokens, next request finished",
        "worker": "alive",
    }


# ---- case 18 ------------------------------------------------------------------------------------


def broken_step():
    raise InjectedFault("injected: the worker loop broke")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_18_a_dead_worker_makes_healthz_503_and_new_requests_fail_at_once(
    engine_factory, inprocess_server, monkeypatch, figures
):
    engine = engine_factory("fake:delay=5")
    server = inprocess_server(engine)
    client = Client(server)
    client.generate("in-flight", max_new_tokens=400)
    client.wait("in-flight", lambda evs: any(e["type"] == "token" for e in evs))

    monkeypatch.setattr(engine, "step", broken_step)  # the worker calls self.step() on its next turn
    events = client.wait("in-flight")
    end = terminals(events)
    assert len(end) == 1 and end[0] is events[-1]
    assert end[0]["type"] == "error" and "the engine worker stopped" in end[0]["message"]
    engine._thread.join(WAIT_S)  # the error is sent while the dying thread is still on its way out
    assert not engine._thread.is_alive()

    health = server.app.test_client().get("/healthz")
    assert health.status_code == 503
    assert (
        "engine worker is not running" in health.json["why"] and "injected: the worker loop broke" in health.json["why"]
    )

    with pytest.raises(UserError) as refused:
        engine.submit(parse_generate(generate_frame(None)), "direct")
    assert refused.value.code == "model_failed"
    after = client.run("after-death")
    assert [e["type"] for e in after] == ["error"] and after[0]["code"] == "model_failed"
    client.close()
    figures["18"] = {
        "healthz": health.status_code,
        "why": health.json["why"],
        "in_flight_request": f"error {end[0]['code']}",
        "new_request": "error model_failed",
    }


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_18b_no_request_is_accepted_while_the_dying_worker_thread_exits(engine_factory, monkeypatch):
    engine = engine_factory("fake:delay=5")
    drained, release = threading.Event(), threading.Event()
    drain = engine._drain

    def descheduled_after_drain(cause):
        drain(cause)
        drained.set()
        release.wait(WAIT_S)  # as if the OS paused the dying thread right after its drain

    monkeypatch.setattr(engine, "_drain", descheduled_after_drain)
    monkeypatch.setattr(engine, "step", broken_step)
    first = engine.submit(parse_generate(generate_frame(None)), "first")
    assert drained.wait(WAIT_S)
    try:
        healthy, _ = engine.health()
        try:
            late = engine.submit(parse_generate(generate_frame(None)), "late")
        except UserError as exc:
            refused, late = exc.code, None
        else:
            refused = None
    finally:
        release.set()
    assert list(first)[-1].type == "error"
    assert late is None or ends_within(late, 2.0), "the late request was queued and is never answered"
    assert not healthy and refused == "model_failed"


def ends_within(handle, seconds: float) -> bool:
    """Whether the request's terminal event comes within `seconds`."""
    deadline = time.monotonic() + seconds
    while (event := handle.next_event(max(0.0, deadline - time.monotonic()))) is not None:
        if event.terminal:
            return True
    return False


# ---- case 19 ------------------------------------------------------------------------------------


def live_tensors() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor))


def cancel_batch(engine, batch: int, n: int) -> Counter:
    """Submit `n` requests at once and cancel them all: the first while it decodes (or, every third
    batch, while it prefills in chunks), the rest while they wait. Returns where each ended."""
    chunked = batch % 3 == 0
    first = engine.submit(
        parse_generate(ask("Tell me everything.", max_new_tokens=400, prefill_chunk=8 if chunked else 0)), f"b{batch}-0"
    )
    rest = [engine.submit(parse_generate(ask("And more.", max_new_tokens=400)), f"b{batch}-{i}") for i in range(1, n)]
    wanted = "prefill_chunk" if chunked else "token"
    while (event := first.next_event(WAIT_S)) is not None and event.type != wanted:
        pass
    for handle in (first, *rest):
        handle.cancel()
    states = Counter()
    for handle in (first, *rest):
        end = list(handle)[-1].to_dict()
        assert end["type"] == "cancelled", end
        states[end["state"]] += 1
    return states


@pytest.mark.parametrize("cancels", [250, pytest.param(1000, marks=pytest.mark.full)])
def test_19_cancelled_requests_leave_no_cache_tensors_or_memory_behind(cancels, engine_factory, figures):
    engine = engine_factory("fake", policy=Policy(max_num_seqs=1))  # one runs, the rest wait: all three states
    per_batch = 5
    for b in range(4):  # warm-up: allocator pools, lazy imports, first-call caches
        cancel_batch(engine, b, per_batch)
    process = psutil.Process()
    tensors_before, rss_before = live_tensors(), process.memory_info().rss
    states = Counter()
    for b in range(cancels // per_batch):
        states += cancel_batch(engine, b, per_batch)
    tensors_after, rss_after = live_tensors(), process.memory_info().rss
    assert sum(states.values()) == cancels and set(states) == {"queued", "prefill", "decode"}
    blocks_held = engine.pool.usage().used
    assert blocks_held == 0, f"{blocks_held} KV blocks still held after every request ended"
    assert tensors_after <= tensors_before, (tensors_before, tensors_after)
    assert engine.active == 0 and not engine.scheduler.waiting and not engine.scheduler.running
    growth_mb = (rss_after - rss_before) / 2**20
    assert growth_mb < 32, f"RSS grew by {growth_mb:.1f} MiB over {cancels} cancelled requests"
    figures[f"19-{cancels}"] = {
        "cancelled": cancels,
        "by_state": dict(states),
        "kv_blocks_held_after": blocks_held,
        "torch_tensors_before": tensors_before,
        "torch_tensors_after": tensors_after,
        "rss_growth_mib": round(growth_mb, 2),
    }
