"""The GPU check: one prepared run (under 8 minutes on an H200) that checks the whole product on a CUDA
machine and writes one JSON file plus a printed summary; exit 1 when a check fails.

    .venv/bin/python scripts/gpu_check.py                 # CUDA, the bundled model → artifacts/gpu-check.json
    .venv/bin/python scripts/gpu_check.py cpu             # a dry run with tiny counts on the CPU (CI runs it)
    .venv/bin/python scripts/gpu_check.py cpu --model default --out /tmp/check.json

1. Decode speed, in-process (model_runner/local/step/graphs.py): a lone stream and 16 streams together, in
   bfloat16 and float32, with CUDA graphs on and off (on the CPU, "on" is the graphs' padded step
   without a graph: the dry run checks the code path, not the speed-up); on CUDA once more in bfloat16
   with SDPA's cuDNN attention off, to say whether it is why bfloat16 ran slower than float32.
2. float32 with graphs on: 8 requests batched get the greedy tokens they get alone; the KV bytes measured
   equal the formula on every token event; every block comes back.
3. `kvscope serve --class` on the device: one answer over /ws, one over /v1/chat/completions, a
   `kvscope class-sim` of 30 students for 60 s (answers/min, TTFT p50/p95), the serving chapter's
   why_batch experiment (its roofline: the device's peak and bandwidth measured there), /api/engine's
   graph captures. Every figure is measured here; none is carried over from elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.class_sim import run_class_sim  # noqa: E402
from model_runner.local.engine import Engine, EngineConfig  # noqa: E402
from model_runner.protocol.request import parse_generate  # noqa: E402
from model_runner.shared.policy import Policy  # noqa: E402

QUESTIONS = [
    "What does a KV cache store?",
    "Name three colours.",
    "Why is the sky blue?",
    "Write a haiku about the sea.",
    "What is a token?",
    "Explain batching in two sentences.",
    "Say hello.",
    "What is the capital of France?",
]
LONG = "Write a long story about a lighthouse keeper and the sea, in many paragraphs."
# (lone tokens, streams, tokens a stream, batched-vs-alone requests and tokens, students, class seconds)
SIZES = {
    "cuda": {
        "lone": 128,
        "streams": 16,
        "stream_tokens": 64,
        "equal": 8,
        "equal_tokens": 32,
        "students": 30,
        "class_s": 60,
    },
    "cpu": {
        "lone": 8,
        "streams": 4,
        "stream_tokens": 6,
        "equal": 3,
        "equal_tokens": 6,
        "students": 3,
        "class_s": 4,
        "why_tokens": 3,
    },
}
TARGETS = {"lone_tok_s_graphs": 300, "graphs_speedup": 8, "streams16_tok_s": 3000}  # the GPU targets, on an H200


T0 = time.monotonic()


def progress(what: str) -> None:
    print(f"gpu_check: {time.monotonic() - T0:6.1f} s  {what}", file=sys.stderr, flush=True)


def ask(question: str, tokens: int):
    return parse_generate({"messages": [{"role": "user", "content": question}], "max_new_tokens": tokens})


def tokens_of(events) -> list[dict]:
    return [e for e in events if e["type"] == "token"]


def decode_rate(runs: list[list[dict]]) -> float | None:
    """Decode tokens a second over the runs: tokens after each first one, over the span from the first
    first token to the last token (the engine's clock, t_ms)."""
    toks = [tokens_of(r) for r in runs]
    firsts = [t[0]["t_ms"] for t in toks if t]
    lasts = [t[-1]["t_ms"] for t in toks if t]
    n = sum(max(0, len(t) - 1) for t in toks)
    span = (max(lasts) - min(firsts)) / 1000 if firsts else 0
    return round(n / span, 1) if span > 0 else None


def together(engine, params, label: str, timeout_s: float = 600) -> list[list[dict]]:
    """Each request's events, all of them queued while admissions are held (admitted in one step, they
    decode in lockstep) and every stream read on its own thread as a client would."""
    with engine.admissions_held():
        handles = [engine.submit(p, f"{label}{i}") for i, p in enumerate(params)]
    out: list[list[dict]] = [[] for _ in handles]

    def read(i, handle):
        out[i] = [e.to_dict() for e in handle]

    threads = [threading.Thread(target=read, args=(i, h)) for i, h in enumerate(handles)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    return out


def speed(device: str, model: str, dtype: str, graphs: str, size: dict) -> dict:
    """Lone and many-stream decode rates of one engine, plus (float32) batched = alone and the KV checks."""
    t0 = time.monotonic()
    policy = Policy(max_num_seqs=max(16, size["streams"]), max_batch_tokens=2048)
    engine = Engine(EngineConfig(model=model, device=device, dtype=dtype, cuda_graphs=graphs, policy=policy)).start()
    engine.wait_ready(600)
    progress(f"{dtype}, graphs {graphs}: ready")
    out = {"dtype": dtype, "model_dtype": engine.facts.dtype, "cuda_graphs": graphs}
    out["ready_s"] = round(time.monotonic() - t0, 1)
    together(engine, [ask(LONG, size["stream_tokens"])] * 2, "warm")  # kernels, allocator, first captures
    together(engine, [ask(LONG, size["lone"])], "warm-lone")  # the lone buckets captured
    lone = [[e.to_dict() for e in engine.submit(ask(LONG, size["lone"]), "lone")]]
    out["lone_tok_s"] = decode_rate(lone)
    progress(f"{dtype}, graphs {graphs}: lone {out['lone_tok_s']} tok/s")
    streams = together(engine, [ask(LONG, size["stream_tokens"])] * size["streams"], "s")
    out[f"streams{size['streams']}_tok_s"] = decode_rate(streams)
    runs = lone + streams
    if dtype == "float32":
        params = [ask(q, size["equal_tokens"]) for q in QUESTIONS[: size["equal"]]]
        alone = [[e.to_dict() for e in engine.submit(p, f"a{i}")] for i, p in enumerate(params)]
        batched = together(engine, params, "b")
        same = [[t["id"] for t in tokens_of(a)] == [t["id"] for t in tokens_of(b)] for a, b in zip(alone, batched)]
        out["batched_equals_alone"] = f"{same.count(True)} of {len(same)}"
        runs += alone + batched
    toks = [t for r in runs for t in tokens_of(r)]
    out["outcomes"] = sorted({r[-1]["type"] for r in runs})
    out["kv_measured_equals_formula"] = all(t["cache_bytes_measured"] == t["cache_bytes_formula"] for t in toks)
    out["max_batch_size"] = max(t["batch_size"] for t in toks)
    out["blocks_held_after"] = engine.pool.usage().used
    out["decode"] = engine.snapshot()["decode"]
    engine.shutdown()
    return out


def without_cudnn_attention(run):
    """run() with SDPA's cuDNN backend switched off (process-wide), then as it was."""
    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        return {k: v for k, v in run().items() if k.endswith("tok_s")}
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)


# ---- the served product -------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: dict | None = None, timeout: float = 600) -> dict:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if body is not None else {}
    with urllib.request.urlopen(urllib.request.Request(url, data, headers), timeout=timeout) as r:
        return json.loads(r.read())


def start_server(device: str, model: str, port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "kvscope.cli", "serve", "--class", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--model", model, "--device", device, "--cuda-graphs", "auto"]
    log = open(ROOT / "artifacts" / "gpu-check-server.log", "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})


def wait_ready(base: str, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if http(f"{base}/api/model", timeout=5)["status"] == "ready":
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server was not ready within {seconds:.0f} s (artifacts/gpu-check-server.log)")


def over_ws(base: str) -> dict:
    from bench.clients import Job, WebSocketClient

    ws = base.replace("http://", "ws://") + "/ws"
    record = WebSocketClient(ws).run(
        Job(payload={"messages": [{"role": "user", "content": "Say hello."}], "max_new_tokens": 16}),
        "ws-1",
        threading.Barrier(1),
    )
    return {"outcome": record.outcome, "tokens": len(record.token_ids), "ttft_ms": record.ttft_ms}


def over_v1(base: str) -> dict:
    model = http(f"{base}/v1/models")["data"][0]["id"]
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16}
    answer = http(f"{base}/v1/chat/completions", body)
    usage = answer["usage"]
    return {
        "model": model,
        "finish_reason": answer["choices"][0]["finish_reason"],
        "completion_tokens": usage["completion_tokens"],
    }


def served(device: str, model: str, size: dict) -> dict:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = start_server(device, model, port)
    try:
        t0 = time.monotonic()
        wait_ready(base)
        progress("server ready")
        out = {"ready_s": round(time.monotonic() - t0, 1), "ws": over_ws(base), "v1": over_v1(base)}
        sim = run_class_sim(base, students=size["students"], minutes=size["class_s"] / 60, short=device == "cpu")
        s = sim.to_dict()
        progress("class-sim done")
        out["class_sim"] = {
            "students": s["students"],
            "seconds": s["seconds"],
            "ok": s["ok"],
            "answers_per_min": round(s["finished"] / (s["seconds"] / 60), 1),
            "ttft_ms": s["ttft_ms"],
            "tokens_per_s": s["tokens_per_s"],
            "errors": s["errors"],
        }
        why = http(f"{base}/api/experiments/why_batch", {"new_tokens": size["why_tokens"]})
        result = why.get("result", why)
        out["why_batch"] = {"points": result.get("points"), "roofline": result.get("roofline")}
        out["decode"] = http(f"{base}/api/engine")["decode"]
        return out
    finally:
        server.terminate()
        server.wait(30)


# ---- the run --------------------------------------------------------------------------------------------------


def command(*cmd: str) -> str | None:
    """A command's output, or None where it is missing or fails (no git checkout, no nvidia-smi)."""
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def environment(device: str) -> dict:
    env = {
        "commit": command("git", "rev-parse", "--short", "HEAD"),
        "uncommitted_changes": bool(command("git", "status", "--porcelain")),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_avg": os.getloadavg(),
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        driver = command("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
        env.update(device=props.name, driver=driver, cuda=torch.version.cuda)
        # bfloat16 and float32 may take different SDPA kernels (cuDNN serves bf16 only): say which are on
        env["sdpa"] = {
            "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
            "efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
        }
    else:
        env["device"] = platform.processor() or platform.machine()
    return env


def verdicts(report: dict, device: str) -> dict:
    """Pass/fail of each check; on CUDA also the GPU speed targets (reported, not failed on)."""
    runs = report["speed"]
    f32 = next(r for r in runs if r["dtype"] == "float32" and r["cuda_graphs"] != "off")
    served_ = report["served"]
    checks = {
        "all_finished": all(r["outcomes"] == ["finished"] for r in runs),
        "kv_measured_equals_formula": all(r["kv_measured_equals_formula"] for r in runs),
        "blocks_returned": all(r["blocks_held_after"] == 0 for r in runs),
        "fp32_batched_equals_alone": f32["batched_equals_alone"].split(" of ")[0]
        == f32["batched_equals_alone"].split(" of ")[1],
        "batched": all(r["max_batch_size"] > 1 for r in runs),
        "graphs_or_padded_ran": all(r["decode"]["static_steps"] > 0 for r in runs if r["cuda_graphs"] != "off"),
        "ws_answered": served_["ws"]["outcome"] == "completed",
        "v1_answered": served_["v1"]["completion_tokens"] > 0,
        "class_sim_ok": served_["class_sim"]["ok"],
        "roofline_measured": bool((served_["why_batch"].get("roofline") or {}).get("peak_flops_s")),
    }
    if device == "cuda":
        by = {(r["dtype"], r["cuda_graphs"]): r for r in runs}
        on, off = by[("bfloat16", "auto")], by[("bfloat16", "off")]
        checks["target_lone_300"] = (on["lone_tok_s"] or 0) >= TARGETS["lone_tok_s_graphs"]
        checks["target_speedup_8x"] = (on["lone_tok_s"] or 0) >= TARGETS["graphs_speedup"] * (off["lone_tok_s"] or 1)
        checks["target_16_streams_3000"] = (on["streams16_tok_s"] or 0) >= TARGETS["streams16_tok_s"]
        checks["target_bf16_ge_fp32"] = all(
            (by[("bfloat16", g)][k] or 0) >= (by[("float32", g)][k] or 0)
            for g in ("auto", "off")
            for k in ("lone_tok_s", "streams16_tok_s")
        )
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("device", nargs="?", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--model", help="default: the bundled model on CUDA, the test model on the CPU")
    parser.add_argument("--out", type=Path, default=ROOT / "artifacts" / "gpu-check.json")
    args = parser.parse_args(argv)
    device, size = args.device, SIZES[args.device]
    model = args.model or ("default" if device == "cuda" else "fake")
    (ROOT / "artifacts").mkdir(exist_ok=True)
    t0 = time.monotonic()
    on = "auto" if device == "cuda" else "padded"
    dtypes = ("bfloat16", "float32") if device == "cuda" else ("float32",)
    report = {"environment": environment(device), "model": model, "sizes": size}
    report["speed"] = [speed(device, model, d, g, size) for d in dtypes for g in (on, "off")]
    if device == "cuda":  # is bf16's slowness cuDNN's attention (bf16 only)? the same run without it
        report["bf16_without_cudnn_attention"] = without_cudnn_attention(
            lambda: speed(device, model, "bfloat16", "off", size)
        )
    report["speed_s"] = round(time.monotonic() - t0, 1)
    report["served"] = served(device, model, size)
    report["checks"] = verdicts(report, device)
    report["seconds"] = round(time.monotonic() - t0, 1)
    args.out.write_text(json.dumps(report, indent=1))
    print(summary(report))
    failed = [k for k, ok in report["checks"].items() if not ok and not k.startswith("target_")]
    return 1 if failed else 0


def summary(report: dict) -> str:
    lines = [f"GPU check on {report['environment']['device']} ({report['model']}), {report['seconds']} s:"]
    for r in report["speed"]:
        rest = {k: v for k, v in r.items() if k.endswith("tok_s") or k == "batched_equals_alone"}
        lines.append(f"  {r['dtype']:9} graphs {r['cuda_graphs']:6} {rest}")
    sim = report["served"]["class_sim"]
    lines.append(
        f"  class-sim: {sim['students']} students, {sim['answers_per_min']} answers/min, TTFT {sim['ttft_ms']}"
    )
    lines += [f"  {'ok  ' if ok else 'FAIL'} {name}" for name, ok in report["checks"].items()]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
