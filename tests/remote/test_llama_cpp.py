"""The remote engine against a real OpenAI-compatible server: llama.cpp's (llama-cpp-python[server]) on
the bundled SmolLM2 GGUF, with `kvscope serve --engine openai:URL` in front. Greedy text through the
proxy equals the server's own, a cancel ends the request, the server dying mid-answer ends it with one
clear error, and the proxy's cost is measured as ratios (scripts/vllm_check.py holds the checks).
Skips, saying why, when llama-cpp-python is not installed (`make test-remote` builds it)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from kvscope_testkit import ARTIFACTS, ROOT, free_port

from model_runner.loading.loader import find_default_gguf

CHECKS_PATH = ROOT / "scripts" / "vllm_check.py"
spec = importlib.util.spec_from_file_location("vllm_check", CHECKS_PATH)
checks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(checks)


def llama_python() -> str | None:
    """A Python with llama_cpp.server: KVSCOPE_LLAMA_PYTHON, .venv-llama, or this one."""
    for candidate in (
        os.environ.get("KVSCOPE_LLAMA_PYTHON"),
        str(ROOT / ".venv-llama" / "bin" / "python"),
        sys.executable,
    ):
        if candidate and Path(candidate).exists():
            probe = subprocess.run([candidate, "-c", "import llama_cpp.server"], capture_output=True)
            if probe.returncode == 0:
                return candidate
    return None


def start_llama(python: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    ARTIFACTS.mkdir(exist_ok=True)
    log = open(ARTIFACTS / f"llama-server-{port}.log", "w")
    cmd = [python, "-m", "llama_cpp.server", "--model", str(find_default_gguf()), "--host", "127.0.0.1",
           "--port", str(port), "--n_ctx", "2048", "--n_threads", "2", "--model_alias", "smollm2-135m-q4_1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama.cpp server exited with {proc.returncode}; see {log.name}")
        try:
            with urllib.request.urlopen(url + "/v1/models", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise TimeoutError("llama.cpp server not ready within 180 s")


@pytest.fixture(scope="module")
def python():
    found = llama_python()
    if found is None:
        pytest.skip(
            "llama-cpp-python[server] is not installed: `make test-remote` builds it into .venv-llama "
            "(or point KVSCOPE_LLAMA_PYTHON at a Python that has it)"
        )
    return found


@pytest.fixture(scope="module")
def llama(python):
    proc, url = start_llama(python)
    yield url
    checks.stop(proc)


@pytest.fixture(scope="module")
def proxy(llama):
    proc, url = checks.start_proxy(llama, log_path=ARTIFACTS / "remote-proxy.log")
    yield url
    checks.stop(proc)


def test_greedy_text_through_the_proxy_equals_llama_cpps(llama, proxy):
    result = checks.check_greedy(llama, proxy)
    assert result["ok"], result


def test_cancel_at_the_proxy_ends_the_request(llama, proxy):
    result = checks.check_cancel(llama, proxy, max_tokens=300)
    assert result["end"] == "cancelled", result


def test_proxy_cost_is_measured_as_ratios(llama, proxy):
    cost = checks.measure_cost(llama, proxy, rounds=5, max_tokens=48)
    (ARTIFACTS / "remote-proxy-cost.json").write_text(json.dumps(cost, indent=2))
    assert cost["ttft_ms"]["proxy_over_direct"] is not None and cost["tok_per_s"]["proxy_over_direct"] is not None


def test_server_dying_mid_answer_ends_with_one_clear_error(python):
    proc, url = start_llama(python)
    proxy_proc, proxy = checks.start_proxy(url)
    try:
        from websockets.sync.client import connect

        with connect(proxy.replace("http", "ws", 1) + "/ws", additional_headers={"Origin": proxy}) as ws:
            frame = {"type": "generate", "request_id": "d", "messages": checks.MESSAGES, "max_new_tokens": 400}
            ws.send(json.dumps(frame))
            events = []
            while not events or events[-1]["type"] not in ("finished", "cancelled", "error"):
                events.append(json.loads(ws.recv(timeout=60)))
                if events[-1]["type"] == "token" and proc.poll() is None:
                    proc.kill()  # the server dies after its first token
        ends = [e for e in events if e["type"] in ("finished", "cancelled", "error")]
        assert len(ends) == 1 and ends[0]["type"] == "error", ends
        assert ends[0]["code"] == "remote_died" and url in ends[0]["message"]
    finally:
        checks.stop(proxy_proc)
        if proc.poll() is None:
            proc.kill()
