"""Records static/data/serving-trace.json: every serving-chapter experiment run on the real model (an
in-process app by default, or a started server with --url), each answer checked against the contract
before the file is written, with the machine and its load when it was recorded.

    .venv/bin/python scripts/record_serving_trace.py            # in-process, the default model
    .venv/bin/python scripts/record_serving_trace.py --url http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from serving_experiments import experiments as lab  # noqa: E402

OUT = ROOT / "static" / "data" / "serving-trace.json"


def in_process(model: str):
    """(post(name) → (status, body), model name, close) on an app around a freshly loaded engine."""
    from app import create_app
    from model_runner.core.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(model=model)).start()
    engine.wait_ready(900)
    client = create_app({"ENGINE": engine, "ALLOW_POLICY_CHANGES": True}).test_client()

    def post(name: str, params: dict):
        response = client.post(f"/api/experiments/{name}", json=params)
        return response.status_code, response.json

    facts = engine.facts  # the weights' route (float32, int8, ...) beside the name: it sets the numbers
    return post, f"{facts.name}, {getattr(facts, 'dtype_route', '') or facts.dtype}", engine.shutdown


def remote(url: str):
    def post(name: str, params: dict):
        request = urllib.request.Request(
            f"{url.rstrip('/')}/api/experiments/{name}",
            data=json.dumps(params).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=600) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)

    with urllib.request.urlopen(f"{url.rstrip('/')}/api/model", timeout=30) as response:
        facts = json.load(response)["facts"] or {}
    return post, facts.get("name"), lambda: None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a started kvscope server (policy changes allowed); default: in-process")
    parser.add_argument("--model", default="default", help="in-process model (default: the bundled SmolLM2)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--only", nargs="*", help="record only these experiments (merged into an existing file)")
    args = parser.parse_args(argv)
    post, model_name, close = remote(args.url) if args.url else in_process(args.model)
    load_start = os.getloadavg()[0]
    names = args.only or list(lab.EXPERIMENTS)
    old = json.loads(args.out.read_text()) if args.only and args.out.exists() else {"experiments": {}}
    experiments = dict(old["experiments"])
    try:
        for name in names:
            t0 = time.monotonic()
            status, body = post(name, {})
            print(f"{name}: {status} in {time.monotonic() - t0:.1f} s (load {os.getloadavg()[0]:.2f})", flush=True)
            if status != 200:
                print(json.dumps(body), file=sys.stderr)
                return 1
            experiments[name] = body
    finally:
        close()
    trace = {
        "schema": 1,
        "recorded_on": {
            "machine": f"{platform.machine()} {platform.processor() or ''}, {os.cpu_count()} cores".replace(" ,", ","),
            "load_1m": round(load_start, 2),
            "load_1m_end": round(os.getloadavg()[0], 2),
            "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "model": model_name,
        },
        "experiments": experiments,
    }
    problems = lab.check_trace(trace)
    if problems:
        print("not written: " + "; ".join(problems), file=sys.stderr)
        return 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(trace, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
