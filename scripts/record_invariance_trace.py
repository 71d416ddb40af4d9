"""Records static/data/invariance-trace.json: the serving chapter's "Why the same prompt can answer
differently" experiment (batch_invariance) run once on the real model in-process, its answer checked against
the experiments contract, with the machine, its load and the route it ran on; the stage reads this file.

    .venv/bin/python scripts/record_invariance_trace.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from record_serving_trace import in_process, recording_context  # noqa: E402

from serving_experiments import harness  # noqa: E402
from serving_experiments.contract import check_response  # noqa: E402

NAME = "batch_invariance"
OUT = ROOT / "static" / "data" / "invariance-trace.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="in-process model (default: the bundled SmolLM2)")
    parser.add_argument("--dtype", default="auto", help="the weights' route (default: auto, as served)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--requests", type=int, default=8, help="questions sent alone and together (default 8)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens each (default 32)")
    parser.add_argument(
        "--job-timeout", type=float, default=harness.JOB_TIMEOUT_S, help="seconds a job may take: a busy machine"
    )
    args = parser.parse_args(argv)
    harness.JOB_TIMEOUT_S = args.job_timeout  # read by each job as it starts
    post, facts, close = in_process(args.model, args.dtype)
    load_start = os.getloadavg()[0]
    try:
        t0 = time.monotonic()
        status, body = post(NAME, {"requests": args.requests, "new_tokens": args.new_tokens})
        print(f"{NAME}: {status} in {time.monotonic() - t0:.1f} s (load {os.getloadavg()[0]:.2f})", flush=True)
    finally:
        close()
    problems = check_response(NAME, body) if status == 200 else [json.dumps(body)]
    if problems:
        print("not written: " + "; ".join(problems), file=sys.stderr)
        return 1
    trace = {
        "schema": 1,
        "recorded_on": recording_context(facts, load_start),
        "experiment": body,
    }
    args.out.write_text(json.dumps(trace, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
