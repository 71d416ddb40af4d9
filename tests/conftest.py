"""Shared fixtures: engines (fake and real), a live gunicorn server on a free port, and Chromium."""
from __future__ import annotations

import pytest

from kvscope_testkit import CHROMIUM, LiveServer  # noqa: E402


@pytest.fixture(scope="session")
def fake_server():
    server = LiveServer("fake")
    try:
        server.wait_ready(60)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def real_server():
    server = LiveServer("default")
    try:
        server.wait_ready(600)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def fake_engine():
    from model_runner.engine import Engine, EngineConfig
    engine = Engine(EngineConfig(model="fake"))
    engine.start()
    engine.wait_ready(60)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def real_engine():
    from model_runner.engine import Engine, EngineConfig
    engine = Engine(EngineConfig(model="default"))
    engine.start()
    engine.wait_ready(600)
    yield engine
    engine.shutdown()


# ---- Playwright: Debian's Chromium, never a downloaded browser ---------------------------------

@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args):
    return {
        **browser_type_launch_args,
        "executable_path": CHROMIUM,
        "args": ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"],
    }


@pytest.fixture
def console_errors(page):
    """Collects console errors and page errors; tests assert it stays empty."""
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return errors
