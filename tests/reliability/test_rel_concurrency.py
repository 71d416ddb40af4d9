"""Cases 15 and 24: many clients at once over live sockets — identical greedy requests give
identical, well-ordered streams, and a classroom of 30 tabs all finish with consistent queue places."""

from __future__ import annotations

import threading
import time

import pytest
from kvscope_testkit import WAIT_S, Client, terminals

from model_runner.loading.fake import ANSWER
from model_runner.local.config import POLICY

ORDER = ["accepted", "queued", "prefill_start", "prefill_end"]


def run_together(server, count: int, **fields) -> tuple[list[list[dict]], float]:
    """`count` clients, one request each, sent at the same moment from their own threads.
    Returns each client's events and the wall time from the start signal to the last end."""
    results: list[list[dict] | BaseException | None] = [None] * count
    go = threading.Barrier(count + 1)

    def one(i: int) -> None:
        try:
            client = Client(server)
            go.wait(WAIT_S)
            results[i] = client.run(f"c{i}", **fields)
            client.close()
        except BaseException as exc:  # reported by the main thread
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,), name=f"client-{i}") for i in range(count)]
    for t in threads:
        t.start()
    go.wait(WAIT_S)
    started = time.monotonic()
    for t in threads:
        t.join(WAIT_S * 4)
    elapsed = time.monotonic() - started
    assert not any(t.is_alive() for t in threads), "a client hung"
    failures = [r for r in results if not isinstance(r, list)]
    assert not failures, failures[0]
    return results, elapsed


def check_stream_order(events: list[dict]) -> None:
    """One request's events: the phases in order, tokens numbered 0..n-1 with the cache growing by
    one each, server times never going back, exactly one terminal event and it is the last."""
    kinds = [e["type"] for e in events]
    assert [k for k in kinds if k in ORDER and k != "queued"] == ["accepted", "prefill_start", "prefill_end"]
    assert kinds[0] == "accepted" and kinds.index("prefill_start") > kinds.index("queued")
    assert len(terminals(events)) == 1 and events[-1]["type"] in ("finished", "cancelled", "error")
    tokens = [e for e in events if e["type"] == "token"]
    assert [t["index"] for t in tokens] == list(range(len(tokens)))
    assert all(b["cache_tokens"] == a["cache_tokens"] + 1 for a, b in zip(tokens, tokens[1:]))
    times = [e["t_ms"] for e in events]
    assert times == sorted(times)
    assert "".join(t["text"] for t in tokens) == events[-1]["text"]


def check_queue_places(events: list[dict]) -> list[int]:
    """A request's `queued` places only move forward (nobody jumps the queue; several places at once
    when several requests join the batch in one step), and `ahead` is the place minus one plus the
    requests running at that moment, at most a full batch."""
    queued = [e for e in events if e["type"] == "queued"]
    places = [q["position"] for q in queued]
    assert places == sorted(places, reverse=True) and places[-1] >= 1, places
    batch = POLICY.max_num_seqs
    assert all(q["position"] - 1 <= q["ahead"] <= q["position"] - 1 + batch for q in queued)
    return places


def test_15_identical_greedy_requests_at_once_give_identical_ordered_streams(fake_server, figures):
    n, length = 5, 72  # 72 tokens: past the emoji, whose bytes span four tokens
    streams, elapsed = run_together(fake_server, n, max_new_tokens=length)
    for events in streams:
        check_stream_order(events)
        check_queue_places(events)
        assert events[-1]["type"] == "finished" and events[-1]["tokens"] == length
    texts = {events[-1]["text"] for events in streams}
    assert len(texts) == 1 and ANSWER.startswith(texts.pop())
    ids = {tuple(e["id"] for e in events if e["type"] == "token") for events in streams}
    assert len(ids) == 1, "the same token ids, not only the same text"
    figures["15"] = {
        "clients": n,
        "distinct_texts": 1,
        "terminal_events_each": 1,
        "tokens_each": len(next(iter(ids))),
        "seconds": round(elapsed, 2),
    }


@pytest.mark.parametrize("clients", [30, pytest.param(45, marks=pytest.mark.full)])
def test_24_a_classroom_of_concurrent_clients_all_finish_with_consistent_queue_places(clients, fake_server, figures):
    streams, elapsed = run_together(
        fake_server, clients, messages=[{"role": "user", "content": "What is a KV cache?"}], max_new_tokens=4
    )
    first_places = []
    for events in streams:
        check_stream_order(events)
        first_places.append(check_queue_places(events)[0])
        assert events[-1]["type"] == "finished" and events[-1]["reason"] == "max_tokens"
    assert max(first_places) <= clients
    ttft = sorted(events[-1]["metrics"]["ttft_ms"] for events in streams)
    figures[f"24-{clients}"] = {
        "clients": clients,
        "finished": len(streams),
        "errors": 0,
        "seconds_for_all": round(elapsed, 2),
        "longest_queue_place": max(first_places),
        "ttft_ms_median": ttft[len(ttft) // 2],
        "ttft_ms_max": ttft[-1],
    }
