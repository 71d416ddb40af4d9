"""`kvscope bench --via-websocket` against a live server (fake model, 20 ms per step): requests go
through the real protocol with a browser's Origin, and every outcome is counted."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from bench.clients import Job, WebSocketClient, run_jobs
from bench.grid import SCHEMA
from bench.report import totals, validate
from kvscope.cli import main


@pytest.fixture
def stepping_server(live_server):
    """The fake model at 20 ms per step: long answers are still running when a timeout or cancel lands."""
    return live_server("fake:delay=20")


def ask(**fields) -> dict:
    return {"messages": [{"role": "user", "content": "Tell me about caches."}], **fields}


def test_outcomes_over_the_socket_are_all_counted(stepping_server):
    jobs = [
        Job(ask(max_new_tokens=200)),
        Job(ask(max_new_tokens=200, timeout_s=0.05)),
        Job(ask(max_new_tokens=200), cancel_after_tokens=3),
        Job(ask(max_new_tokens=5000)),  # invalid: the protocol allows at most 1024
    ]
    records, _ = run_jobs(WebSocketClient(stepping_server.ws_url), jobs, "ws")
    assert [r.outcome for r in records] == ["completed", "timeout", "cancelled", "error"]
    assert records[3].reason == "invalid_request"
    t = totals(records)
    assert (t["requests"], t["completed"], t["timeouts"], t["cancelled"], t["errors"]) == (4, 1, 1, 1, 1)
    done = records[0]
    assert len(done.token_ids) == len(done.itl_ms) + 1 > 10
    assert len(done.delivery_ms) == len(done.token_ids) and min(done.delivery_ms) >= 0
    assert all(lo <= up for lo, up in zip(done.delivery_lower_ms, done.delivery_ms))


def test_refused_connection_is_a_counted_failure():
    records, _ = run_jobs(WebSocketClient("ws://127.0.0.1:9/ws"), [Job(ask())], "nobody")
    assert (records[0].outcome, records[0].reason) == ("error", "connect_failed")


def test_bench_command_over_the_socket(stepping_server, tmp_path):
    path = tmp_path / "ws.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(
            [
                "bench",
                "--model",
                "fake",
                "--via-websocket",
                stepping_server.ws_url,
                "--prompt-lens",
                "60",
                "--output-lens",
                "6",
                "--concurrency",
                "1,2",
                "--repeats",
                "1",
                "--no-cache-probe",
                "--no-baselines",
                "--json",
                str(path),
                "--no-progress",
            ]
        )
    report = json.loads(path.read_text())
    assert code == 0 and validate(report, SCHEMA) == []
    assert report["mode"] == "websocket" and report["totals"]["completed"] == report["totals"]["requests"] == 3
    delivery = report["ratios"]["delivery_p95_ms"]
    assert delivery["target"] == 30.0 and delivery["value_lower"] <= delivery["value"]
    assert "over the WebSocket" in printed.getvalue() and "deliv-lo" in printed.getvalue()


def test_baselines_beside_the_socket(stepping_server, tmp_path):
    path = tmp_path / "ws-baselines.json"
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(
            [
                "bench",
                "--model",
                "fake",
                "--via-websocket",
                stepping_server.ws_url,
                "--prompt-lens",
                "60",
                "--output-lens",
                "6",
                "--concurrency",
                "1",
                "--repeats",
                "2",
                "--no-cache-probe",
                "--json",
                str(path),
                "--no-progress",
            ]
        )
    report = json.loads(path.read_text())
    assert code == 0 and validate(report, SCHEMA) == []
    assert [len(c["order"]) for c in report["comparisons"]] == [4, 4]  # stepped engine, bare, generate, socket
    assert all("socket" in c["order"] and c["greedy_identical"] for c in report["comparisons"])
    cell = report["cells"][0]
    assert cell["delivery_ms"]["n"] > 0 and cell["totals"]["requests"] == 2  # the cell is the socket's
    assert report["totals"]["requests"] == 2 + 2  # plus the stepped engine's request in each repeat
