"""Shared test helpers, importable by name from any test folder (`conftest` is not: each folder
may have its own): a live gunicorn server on a free port, and screenshots into artifacts/."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

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
        cmd = [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1",
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


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=False)
    return path
