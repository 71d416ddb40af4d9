"""Shared fixtures: engines (fake and real), a live gunicorn server on a free port, and Chromium."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = os.environ.get("KVSCOPE_CHROMIUM", "/usr/bin/chromium")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """kvscope under gunicorn (one worker, gthread) in a subprocess, as users run it."""

    def __init__(self, model: str, extra_env: dict | None = None, extra_args: list[str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}/ws"
        self.log_path = ARTIFACTS / f"server-{model.replace('/', '_')}-{self.port}.log"
        ARTIFACTS.mkdir(exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(extra_env or {})}
        cmd = [sys.executable, "-m", "model_runner.cli", "serve", "--host", "127.0.0.1",
               "--port", str(self.port), "--model", model, *(extra_args or [])]
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 300.0) -> dict:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url + "/api/model", timeout=2) as r:
                    last = json.load(r)
                if last.get("status") == "ready":
                    return last
                if last.get("status") == "failed":
                    raise RuntimeError(f"model failed: {last}")
            except OSError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"server not ready after {timeout}s: {last}")

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


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


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=False)
    return path
