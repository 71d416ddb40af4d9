"""Checks kvscope's remote engine against a running OpenAI-compatible server (vLLM on a GPU machine,
llama.cpp's server, or another kvscope): starts `kvscope serve --engine openai:URL` in front of it, then
(1) greedy text through the proxy's WebSocket equals the server's own answer, (2) a cancel at the proxy
ends the request and the server's running count falls back (where it has vLLM's /metrics), and (3) the
proxy's cost: TTFT and decode tok/s through the proxy vs streaming from the server directly, same run,
as ratios. Prints one JSON object; exit status 1 when a check fails. tests/remote/ runs these functions.

On a GPU machine (vLLM's CUDA build, in its own venv):

    pip install vllm
    vllm serve HuggingFaceTB/SmolLM2-135M-Instruct --port 8001 --max-model-len 2048 &
    .venv/bin/python scripts/vllm_check.py --url http://127.0.0.1:8001 --engine-config PATH_TO_MODEL_FOLDER

On this CPU machine, vLLM's CPU build (`make test-vllm` installs it into .venv-vllm and runs these checks):

    .venv/bin/python scripts/vllm_serve.py --port 8001 &
    .venv/bin/python scripts/vllm_check.py --url http://127.0.0.1:8001 \
        --engine-config "$(.venv/bin/python scripts/vllm_serve.py --prepare)"
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
MESSAGES = [{"role": "user", "content": "Explain in two sentences what a KV cache stores."}]


# ---- talking to servers ---------------------------------------------------------------------------


def get_json(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


def server_model(url: str) -> str:
    return get_json(url.rstrip("/") + "/v1/models")["data"][0]["id"]


def stream_direct(url: str, model: str, max_tokens: int, logprobs: bool = False) -> dict:
    """One streaming chat completion straight from the server: text, TTFT and decode tok/s at this client.
    logprobs: ask for the top 5 candidates per token, as kvscope's remote engine always does."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)
    body = {"model": model, "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if logprobs:
        body.update(logprobs=True, top_logprobs=5)
    start = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200, response.read()[:300]
    times, text = [], ""
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data:") or line.endswith("[DONE]"):
            continue
        choices = json.loads(line[5:]).get("choices") or [{}]
        piece = (choices[0].get("delta") or {}).get("content")
        if piece:
            times.append(time.perf_counter())
            text += piece
    conn.close()
    return timing(text, start, times)


def stream_proxy(proxy: str, max_tokens: int, rid: str = "check") -> dict:
    """The same through kvscope's WebSocket, as the page asks: text, TTFT and tok/s at this client."""
    from websockets.sync.client import connect

    with connect(proxy.replace("http", "ws", 1) + "/ws", additional_headers={"Origin": proxy}) as ws:
        start = time.perf_counter()
        ws.send(json.dumps({"type": "generate", "request_id": rid, "messages": MESSAGES, "max_new_tokens": max_tokens}))
        times, text, end = [], "", None
        while end is None:
            event = json.loads(ws.recv(timeout=120))
            if event["type"] == "token" and event["text"]:
                times.append(time.perf_counter())
                text += event["text"]
            elif event["type"] in ("finished", "cancelled", "error"):
                end = event
    return {**timing(text, start, times), "end": end["type"], "message": end.get("message")}


def timing(text: str, start: float, times: list[float]) -> dict:
    decode = times[-1] - times[0] if len(times) > 1 else 0.0
    return {
        "text": text,
        "ttft_ms": (times[0] - start) * 1000 if times else None,
        "e2e_ms": (times[-1] - start) * 1000 if times else None,  # to the last token, at this client
        "tok_per_s": (len(times) - 1) / decode if decode > 0 else None,
    }


def running(url: str) -> float | None:
    """vllm:num_requests_running from the server's /metrics, or None where it has none."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:num_requests_running")]
    return sum(values) if values else None


# ---- the proxy ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_proxy(url: str, engine_config: str | None = None, log_path: Path | None = None) -> tuple:
    """`kvscope serve --engine openai:URL` on a free port; (process, its URL) once it is ready."""
    port = free_port()
    cmd = [sys.executable, "-m", "kvscope.cli", "serve", "--port", str(port), "--engine", f"openai:{url}"]
    if engine_config:
        cmd += ["--engine-config", engine_config]
    out = open(log_path, "w") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ})
    proxy = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"kvscope serve exited with {proc.returncode}")
        try:
            if get_json(proxy + "/api/model", 2)["status"] == "ready":
                return proc, proxy
        except OSError:
            pass
        time.sleep(0.3)
    proc.terminate()
    raise TimeoutError("the proxy was not ready within 120 s")


def stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()


# ---- the checks -----------------------------------------------------------------------------------


def check_greedy(url: str, proxy: str, max_tokens: int = 32) -> dict:
    direct = stream_direct(url, server_model(url), max_tokens)
    relayed = stream_proxy(proxy, max_tokens)
    return {"ok": relayed["end"] == "finished" and relayed["text"] == direct["text"], "direct": direct["text"],
            "proxy": relayed["text"], "end": relayed["end"], "message": relayed["message"]}  # fmt: skip


def check_cancel(url: str, proxy: str, max_tokens: int = 400) -> dict:
    """Cancel after the first token; the proxy answers `cancelled`, and the server stops running it."""
    from websockets.sync.client import connect

    with connect(proxy.replace("http", "ws", 1) + "/ws", additional_headers={"Origin": proxy}) as ws:
        ws.send(json.dumps({"type": "generate", "request_id": "c", "messages": MESSAGES, "max_new_tokens": max_tokens}))
        seen, before = [], None
        while True:
            event = json.loads(ws.recv(timeout=120))
            seen.append(event["type"])
            if event["type"] == "token" and before is None:
                before = running(url)  # the server is running it now (where it has /metrics)
                ws.send(json.dumps({"type": "cancel", "request_id": "c"}))
            if event["type"] in ("finished", "cancelled", "error"):
                break
    deadline, after = time.monotonic() + 10, running(url)
    while after not in (None, 0.0) and time.monotonic() < deadline:
        time.sleep(0.2)
        after = running(url)
    unseen = "no /metrics: not observable"
    return {"ok": seen[-1] == "cancelled" and after in (None, 0.0), "end": seen[-1],
            "server_running_before": before if before is not None else unseen,
            "server_running_after": after if after is not None else unseen}  # fmt: skip


def measure_cost(url: str, proxy: str, rounds: int = 5, max_tokens: int = 64) -> dict:
    """Median TTFT, decode tok/s and E2E, alternating in the same run: straight from the server without
    and with top-5 logprobs (what the proxy asks for), and through the proxy. proxy / direct (same
    request) is the hop's cost; direct with / without logprobs is what the candidates cost the server."""
    model = server_model(url)
    plain, direct, relayed = [], [], []
    for i in range(rounds):
        plain.append(stream_direct(url, model, max_tokens))
        direct.append(stream_direct(url, model, max_tokens, logprobs=True))
        relayed.append(stream_proxy(proxy, max_tokens, rid=f"m{i}"))

    def med(runs, key):
        values = [r[key] for r in runs if r[key] is not None]
        return statistics.median(values) if values else None

    out = {"rounds": rounds, "max_tokens": max_tokens, "load": os.getloadavg()}
    for key in ("ttft_ms", "tok_per_s", "e2e_ms"):
        n, d, p = med(plain, key), med(direct, key), med(relayed, key)
        out[key] = {
            "direct_no_logprobs": n,
            "direct": d,
            "proxy": p,
            "proxy_over_direct": p / d if d and p else None,
            "logprobs_over_no_logprobs": d / n if d and n else None,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8001")
    parser.add_argument("--engine-config", help="the model's config.json or folder, passed to kvscope")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    proc, proxy = start_proxy(args.url, args.engine_config)
    try:
        report = {
            "greedy": check_greedy(args.url, proxy),
            "cancel": check_cancel(args.url, proxy),
            "cost": measure_cost(args.url, proxy, args.rounds),
        }
    finally:
        stop(proc)
    print(json.dumps(report, indent=2))
    return 0 if report["greedy"]["ok"] and report["cancel"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
