"""Records static/data/invariance-trace.json: the serving chapter's "Why the same prompt can answer
differently" experiment (batch_invariance) run once on the real model in-process, its answer checked against
the experiments contract, with the machine, its load and the route it ran on; the stage reads this file.

    .venv/bin/python scripts/record_invariance_trace.py
    .venv/bin/python scripts/record_invariance_trace.py --from-serving-trace static/data/serving-trace.json

--from-serving-trace copies the experiment out of a serving-chapter recording (scripts/record_serving_trace.py,
which once ran it with the others) instead of running it; allowed only where it was that recording's last run,
so the recording's end date, `uptime` and the answer's own load are this experiment's, and the load as it
began is the one the experiment before it ended at.
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


def copied_from_serving_trace(trace: dict, source: str) -> dict:
    """This file's content taken from a serving-chapter recording that ran the experiment last among the
    others: the answer as it was, recorded_on from that recording, with the experiment's own start and end load."""
    names = list(trace.get("experiments", {}))
    merged = [n for m in trace.get("recorded_on", {}).get("merged", []) for n in m["experiments"]]
    if not names or names[-1] != NAME or NAME in merged:
        raise ValueError(
            f"{source}: `{NAME}` is not the last experiment of a full run there, so its date and load are not known"
        )
    on, body = trace["recorded_on"], trace["experiments"][NAME]
    # each answer's machine.load_1m is read as the answer is built: the one before ended as this one began
    before = trace["experiments"][names[-2]]["machine"]["load_1m"] if len(names) > 1 else on["load_1m"]
    recorded_on = {
        # the serving file's own later edits are its history, not this file's (which lists its own)
        **{k: v for k, v in on.items() if k not in ("merged", "edited_after_recording")},
        "load_1m": before,
        "load_1m_end": body["machine"]["load_1m"],
        "copied_from": {
            "file": source,
            "experiments_before": names[:-1],
            "load_1m": f"as `{names[-2]}` ended, just before this one began" if len(names) > 1 else "as it began",
        },
    }
    return {"schema": 1, "recorded_on": recorded_on, "experiment": body}


def write(trace: dict, out: Path) -> int:
    problems = check_response(NAME, trace["experiment"])
    if problems:
        print("not written: " + "; ".join(problems), file=sys.stderr)
        return 1
    out.write_text(json.dumps(trace, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="in-process model (default: the bundled SmolLM2)")
    parser.add_argument("--dtype", default="auto", help="the weights' route (default: auto, as served)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--requests", type=int, default=8, help="questions sent alone and together (default 8)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens each (default 32)")
    parser.add_argument(
        "--from-serving-trace", type=Path, help="copy the experiment from this serving-chapter recording, run nothing"
    )
    parser.add_argument(
        "--job-timeout", type=float, default=harness.JOB_TIMEOUT_S, help="seconds a job may take: a busy machine"
    )
    args = parser.parse_args(argv)
    if args.from_serving_trace:
        source = args.from_serving_trace.resolve()
        trace = json.loads(source.read_text(encoding="utf-8"))
        name = str(source.relative_to(ROOT)) if source.is_relative_to(ROOT) else str(source)
        try:
            return write(copied_from_serving_trace(trace, name), args.out)
        except ValueError as exc:
            print(f"not written: {exc}", file=sys.stderr)
            return 1
    harness.JOB_TIMEOUT_S = args.job_timeout  # read by each job as it starts
    post, facts, close = in_process(args.model, args.dtype)
    load_start = os.getloadavg()[0]
    try:
        t0 = time.monotonic()
        status, body = post(NAME, {"requests": args.requests, "new_tokens": args.new_tokens})
        print(f"{NAME}: {status} in {time.monotonic() - t0:.1f} s (load {os.getloadavg()[0]:.2f})", flush=True)
    finally:
        close()
    if status != 200:
        print("not written: " + json.dumps(body), file=sys.stderr)
        return 1
    return write({"schema": 1, "recorded_on": recording_context(facts, load_start), "experiment": body}, args.out)


if __name__ == "__main__":
    sys.exit(main())
