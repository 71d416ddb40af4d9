"""Records static/data/serving-trace.json: every serving-chapter experiment run on the real model (an
in-process app by default, or a started server with --url), each answer checked against the contract
and each roofline's floors checked (below the step they bound, non-decreasing in rows) before the file is
written (a recording that fails is refused), with the route the model ran on (`--dtype auto`: int4 on an AVX-512 CPU),
the machine and its load (`uptime`) when it was recorded.

    .venv/bin/python scripts/record_serving_trace.py            # in-process, the default model
    .venv/bin/python scripts/record_serving_trace.py --url http://127.0.0.1:8000
    .venv/bin/python scripts/record_serving_trace.py --only attention_cost   # merged into the file

Experiments recorded in a file of their own (contract.RECORDED_APART: batch_invariance, by
scripts/record_invariance_trace.py) are not run here.

With --only, the file's `recorded_on` (which describes the full recording) is kept, and the merged
experiments are listed under its `merged` with their own date and load (each answer has its machine).
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

from model_runner.protocol.trace import host_context, route_of, warm_up  # noqa: E402
from serving_experiments.contract import RECORDED_APART, check_trace, decoder_words  # noqa: E402
from serving_experiments.evidence import floor_problems  # noqa: E402
from serving_experiments.evidence import problem_words as floor_words  # noqa: E402
from serving_experiments.registry import EXPERIMENTS  # noqa: E402

OUT = ROOT / "static" / "data" / "serving-trace.json"


def in_process(model: str, dtype: str):
    """(post(name) → (status, body), model facts, close) on an app around a freshly loaded engine."""
    from app import create_app
    from model_runner.local.engine import Engine, EngineConfig

    # a busy machine stretches the runs; a request's time limit must not cut an experiment short
    engine = Engine(EngineConfig(model=model, dtype=dtype, timeout_s=600.0)).start()
    engine.wait_ready(900)
    warm_up(engine)  # the first decode steps of a fresh process pay one-off costs (1 s a step on int4 here)
    client = create_app({"ENGINE": engine, "ALLOW_POLICY_CHANGES": True}).test_client()
    facts = {**engine.facts.to_dict(), "decoder": engine.decoder()}

    def post(name: str, params: dict):
        response = client.post(f"/api/experiments/{name}", json=params)
        return response.status_code, response.json

    return post, facts, engine.shutdown


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
        model = json.load(response)
    return post, {**(model["facts"] or {}), "decoder": model.get("decoder")}, lambda: None


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The processor's model name as Linux's /proc/cpuinfo gives it ("Intel(R) Xeon(R) Processor"), or ""
    where there is no such file (not Linux) or no such line."""
    try:
        with cpuinfo.open(encoding="utf-8") as info:
            return next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "")
    except OSError:
        return ""


def machine_name() -> str:
    """The machine a recording was made on, as the page names it: the CPU's model name, its architecture
    and core count ("Intel(R) Xeon(R) Processor, x86_64, 2 cores")."""
    return ", ".join(part for part in (cpu_model(), platform.machine(), f"{os.cpu_count()} cores") if part)


def recording_context(facts: dict, load_start: float) -> dict:
    """Where and when a recording was made: the machine, its load before and after, the model and its route."""
    return {
        "machine": machine_name(),
        "load_1m": round(load_start, 2),
        "load_1m_end": round(os.getloadavg()[0], 2),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        # the weights' route beside the name: it sets the numbers (the page names it with the run)
        "model": f"{facts.get('name')}, {facts.get('dtype_route') or facts.get('dtype')}",
        "route": route_of(facts),
        "decoder": decoder_words(facts.get("decoder")),  # the same model runs at another speed on the other one
        "cpus": os.cpu_count(),
        **host_context(),  # of the machine running this script (the server's, in-process)
    }


def with_processor(body: dict, processor: str) -> dict:
    """An experiment's answer with its machine naming the processor it ran on (the server names only its
    architecture): added where known, never guessed."""
    if not processor:
        return body
    return {**body, "machine": {**body.get("machine", {}), "processor": processor}}


def names_to_record(only: list[str] | None) -> list[str]:
    """The experiments this script runs: those named by --only, or all; never one recorded apart, whose
    run (minutes, and its own machine and load) belongs in its own file."""
    apart = [name for name in only or [] if name in RECORDED_APART]
    if apart:
        raise SystemExit(
            f"--only: {', '.join(apart)} is recorded apart, in {', '.join(RECORDED_APART[n] for n in apart)}"
            " (scripts/record_invariance_trace.py)"
        )
    return only or [name for name in EXPERIMENTS if name not in RECORDED_APART]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a started kvscope server (policy changes allowed); default: in-process")
    parser.add_argument("--model", default="default", help="in-process model (default: the bundled SmolLM2)")
    parser.add_argument("--dtype", default="auto", help="in-process weights' route (default: auto, as served)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--only", nargs="*", help="record only these experiments (merged into an existing file)")
    args = parser.parse_args(argv)
    names = names_to_record(args.only)  # before the model loads: a refused name costs nothing
    post, facts, close = remote(args.url) if args.url else in_process(args.model, args.dtype)
    load_start = os.getloadavg()[0]
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
            # in-process, this script's processor is the one that ran the experiment; a remote server's is not known
            experiments[name] = body if args.url else with_processor(body, cpu_model())
    finally:
        close()
    recorded_on = recording_context(facts, load_start)
    if args.only and "recorded_on" in old:  # a merge: the other experiments keep the recording they came from
        merged = {
            "experiments": names,
            "date": recorded_on["date"],
            "machine": recorded_on["machine"],
            "cpu_capability": recorded_on["cpu_capability"],
            "load_1m": recorded_on["load_1m"],
            "load_1m_end": recorded_on["load_1m_end"],
        }
        recorded_on = {**old["recorded_on"], "merged": [*old["recorded_on"].get("merged", []), merged]}
    return write_checked({"schema": 1, "recorded_on": recorded_on, "experiments": experiments}, args.out)


def refusals(trace: dict) -> list[str]:
    """Why a recording is not written: the contract's shapes, then each roofline's floors (a floor above the
    step it bounds, or one that falls as rows grow, is a measurement that cannot carry a verdict)."""
    problems = check_trace(trace)
    for name, body in trace.get("experiments", {}).items():
        points = (body.get("result") or {}).get("roofline", {}).get("points", [])
        problems += [f"{name}: {floor_words(q, points)}" for q in floor_problems(points)]
    return problems


def write_checked(trace: dict, out: Path) -> int:
    """Writes `trace` to `out` only if nothing refuses it; → the script's exit status."""
    problems = refusals(trace)
    if problems:
        print("not written: " + "; ".join(problems), file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(trace, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
