"""Fixtures of the reliability suite: a slow live server (30 ms per model step, 1 s pings, 1 s send
timeout) for mid-stream cases, in-process engines and servers for fault injection, and a record
of the figures each case produced (artifacts/reliability-figures.json, quoted in docs/reliability.md)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvscope_testkit import LiveServer
from reliability_kit import PING_INTERVAL_S, SEND_TIMEOUT_S, InProcessServer

ROOT = Path(__file__).resolve().parents[2]
FIGURES_PATH = ROOT / "artifacts" / "reliability-figures.json"




@pytest.fixture(scope="session")
def slow_server():
    """gunicorn with the fake model at 30 ms per step, so a request is still running when a test
    misbehaves at it; pings every second and a 1 s send limit, so half-open and non-reading
    clients are found out within the test's time. Same frame limit as the default."""
    from app import FRAME_LIMIT
    server = LiveServer("fake:delay=30", extra_env={
        "KVSCOPE_SOCK_SERVER_OPTIONS": json.dumps({"max_message_size": FRAME_LIMIT, "ping_interval": PING_INTERVAL_S}),
        "KVSCOPE_SEND_TIMEOUT_S": str(SEND_TIMEOUT_S),
    })
    try:
        server.wait_ready(120)
        yield server
    finally:
        server.stop()


def make_engine(model: str = "fake", **config):
    from model_runner.engine import Engine, EngineConfig
    engine = Engine(EngineConfig(model=model, **config)).start()
    engine.wait_ready(60)
    return engine


@pytest.fixture
def engine_factory():
    """Fresh in-process engines (a test may break them); all shut down afterwards."""
    made = []

    def factory(model: str = "fake", **config):
        made.append(make_engine(model, **config))
        return made[-1]

    yield factory
    for engine in made:
        engine.shutdown()


@pytest.fixture
def inprocess_server():
    """An InProcessServer factory around a given engine; servers stop after the test."""
    made = []

    def factory(engine, **config):
        made.append(InProcessServer(engine, **config))
        return made[-1]

    yield factory
    for server in made:
        server.stop()


@pytest.fixture(scope="session")
def figures():
    """case number → what it measured; written out at the end of the session."""
    record: dict[str, dict] = {}
    yield record
    if record:
        FIGURES_PATH.parent.mkdir(exist_ok=True)
        old = json.loads(FIGURES_PATH.read_text()) if FIGURES_PATH.exists() else {}
        FIGURES_PATH.write_text(json.dumps({**old, **record}, indent=2, ensure_ascii=False, sort_keys=True) + "\n")
